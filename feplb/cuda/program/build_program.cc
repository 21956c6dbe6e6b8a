#include "feplb/cuda/program/build_program.h"

namespace feplb::cuda {
namespace {

constexpr StreamId kCompute = StreamId::kCompute;
constexpr StreamId kCopyIn = StreamId::kCopyIn;
constexpr StreamId kCopyOut = StreamId::kCopyOut;

Step& add(StepList& out, Op op, StreamId stream) {
  out.steps.emplace_back();
  Step& s = out.steps.back();
  s.op = op;
  s.stream = stream;
  return s;
}
void kernel(StepList& out, KernelId k, StreamId stream = kCompute, int64_t count = 0) {
  Step& s = add(out, Op::kKernel, stream);
  s.kernel = k;
  s.count = count;
}
void record(StepList& out, EventId e, StreamId stream) { add(out, Op::kRecord, stream).event = e; }
void wait_event(StepList& out, EventId e, StreamId stream) {
  add(out, Op::kWaitEvent, stream).event = e;
}
void mark(StepList& out, Mark m, bool backward, StreamId stream = kCompute) {
  Step& s = add(out, Op::kMark, stream);
  s.mark = m;
  s.backward = backward;
}
void signal(StepList& out, SignalFamily f, int peer, Value v, StreamId stream) {
  Step& s = add(out, Op::kSignal, stream);
  s.family = f;
  s.peer = peer;
  s.value = v;
}
void wait(StepList& out, SignalFamily f, int peer, Value v, StreamId stream) {
  Step& s = add(out, Op::kWait, stream);
  s.family = f;
  s.peer = peer;
  s.value = v;
}
// An owner's inputs landed here: the guests' stream idles until then (the timeline's waits).
void wait_owner(StepList& out, int owner, bool backward) {
  wait(out, SignalFamily::kInputsLanded, owner, Value::kCall, kCompute);
  out.steps.back().timed = true;
  out.steps.back().backward = backward;
}
void host(StepList& out, HostAction a, StreamId stream = kCompute) {
  add(out, Op::kHost, stream).action = a;
}
void post(StepList& out, HostFlag f, StreamId stream = kCompute) {
  add(out, Op::kPost, stream).flag = f;
}
void await(StepList& out, HostFlag f, StreamId stream = kCompute) {
  add(out, Op::kAwait, stream).flag = f;
}
void all_gather(StepList& out, int64_t count) { add(out, Op::kAllGather, kCompute).count = count; }
// A step over the copies added since `begin`.
void copies_step(StepList& out, Op op, StreamId stream, size_t begin) {
  Step& s = add(out, op, stream);
  s.begin = static_cast<uint32_t>(begin);
  s.end = static_cast<uint32_t>(out.copies.size());
}
void copy(StepList& out, Ref dst, Ref src, int64_t rows = 0) {
  out.copies.push_back({dst, src, rows});
}

// The pending prefetch's weights landed here, owner by owner.
void prefetch_waits(StepList& out, const CallFacts& f, StreamId stream) {
  for (int d = 0; d < f.world; ++d) {
    if (f.prefetch_into_here[static_cast<size_t>(d)])
      wait(out, SignalFamily::kPrefetchLanded, d, Value::kPrefetch, stream);
  }
}

// The call is done with the guest slots of the ranks it touched: those that ran guests (`layout`,
// null when it ran none) and, when it settled the pending prefetch, those it wrote into. Every
// rank counts every rank's; a touched rank tells its peers.
void slots_quiet(StepList& out, const StepLayout* layout, const CallFacts& f) {
  for (int g = 0; g < f.world; ++g) {
    const bool used = (layout && layout->guest_experts(g) > 0) ||
                      (f.settle && f.prefetch_targets[static_cast<size_t>(g)]);
    if (!used) continue;
    add(out, Op::kBumpQuiet, kCompute).peer = g;
    if (g != f.rank) continue;
    for (int p = 0; p < f.world; ++p) {
      if (p != f.rank) signal(out, SignalFamily::kSlotsQuiet, p, Value::kQuiet, kCompute);
    }
  }
}

// The end of every call: the copy streams' buffers ordered before the next call, a settled
// prefetch's copies too.
void finish_call(StepList& out, const CallFacts& f) {
  await(out, HostFlag::kCopiesOut);
  wait_event(out, EventId::kCopyInDone, kCompute);
  wait_event(out, EventId::kCopyOutDone, kCompute);
  if (f.settle) {
    wait_event(out, EventId::kPrefetchDone, kCompute);
    host(out, HostAction::kDropPrefetch);
  }
}

// Phase 1 (`reverse`: its mirror) over the layout's chunks.
void exchange(StepList& out, const StepLayout& layout, bool reverse, Buf send_buf, Buf home_buf,
              Buf guest_buf) {
  Step& s = add(out, Op::kExchange, kCompute);
  s.backward = reverse;
  s.begin = static_cast<uint32_t>(out.exchanges.size());
  const auto sends = reverse ? layout.recvs() : layout.sends();
  const auto recvs = reverse ? layout.sends() : layout.recvs();
  for (const RowChunk& c : sends) {
    const Buf b = reverse ? (c.guest ? guest_buf : home_buf) : send_buf;
    out.exchanges.push_back({c.peer, Ref{b, -1, c.row}, c.rows});
  }
  out.steps.back().mid = static_cast<uint32_t>(out.exchanges.size());
  for (const RowChunk& c : recvs) {
    const Buf b = reverse ? send_buf : (c.guest ? guest_buf : home_buf);
    out.exchanges.push_back({c.peer, Ref{b, -1, c.row}, c.rows});
  }
  out.steps.back().end = static_cast<uint32_t>(out.exchanges.size());
}

// Own experts' FFNs (static first, the layout's order): inputs at `x`, dY at `dy` (backward),
// outputs (dX) at `y`, at the rows' positions.
// Backward with `overwrite`: each expert's first dW GEMM writes its gradient (beta 0); experts
// without one are zeroed by zero_grads_without_home_work.
void home_gemms(StepList& out, const StepLayout& layout, bool backward, Buf x, Buf dy, Buf y,
                bool overwrite = false) {
  const size_t begin = out.gemms.size();
  for (const HomeWork& hw : layout.home_work()) {
    bool first = true;
    for (size_t j = begin; j < out.gemms.size(); ++j)
      first = first && out.gemms[j].expert != hw.expert;
    GemmItem g;
    if (backward && overwrite && first) g.beta = 0.0f;
    g.expert = hw.expert;
    g.rows = hw.rows;
    g.x = {x, -1, hw.row};
    g.dy = backward ? Ref{dy, -1, hw.row} : Ref{};
    g.y = {y, -1, hw.row};
    g.w = {Buf::kWeights, -1, hw.local_index};
    g.g = backward ? Ref{Buf::kGrads, -1, hw.local_index} : Ref{};
    g.act_row = hw.row;
    out.gemms.push_back(g);
  }
  Step& s = add(out, Op::kGemm, kCompute);
  s.backward = backward;
  s.begin = static_cast<uint32_t>(begin);
  s.end = static_cast<uint32_t>(out.gemms.size());
}

// One owner's guests [i, end) of the layout's list.
void guest_gemms(StepList& out, std::span<const GuestWork> guests, size_t i, size_t end,
                 bool backward, Buf guest_x) {
  const size_t begin = out.gemms.size();
  for (; i < end; ++i) {
    const GuestWork& w = guests[i];
    GemmItem g;
    g.expert = w.expert;
    g.rows = w.rows;
    g.guest = true;
    g.x = backward ? Ref{Buf::kXGuest, -1, w.row}
                   : Ref{w.dispatched ? guest_x : Buf::kGuestIn, -1, w.row};
    g.dy = backward ? Ref{Buf::kGuestIn, -1, w.row} : Ref{};
    g.y = {Buf::kGuestOut, -1, w.row};
    g.w = {Buf::kGuestSlot, -1, w.slot};
    g.g = backward ? Ref{Buf::kGradSlot, -1, w.slot} : Ref{};
    g.act_row = w.row;
    g.beta = 0.0f;
    out.gemms.push_back(g);
  }
  Step& s = add(out, Op::kGemm, kCompute);
  s.backward = backward;
  s.begin = static_cast<uint32_t>(begin);
  s.end = static_cast<uint32_t>(out.gemms.size());
}

// Copied (kHome) guests' results back into their owners' home rows, owner by owner, each batch
// ended by rows_back; one-hop guests' results go back in the reverse all-to-all-v.
void send_rows_back(StepList& out, const StepLayout& layout) {
  const auto guests = layout.guest_work();
  for (size_t i = 0; i < guests.size();) {
    const int owner = guests[i].owner;
    const size_t begin = out.copies.size();
    for (; i < guests.size() && guests[i].owner == owner; ++i) {
      const GuestWork& g = guests[i];
      if (g.dispatched) continue;
      copy(out, {Buf::kPeerResultsHome, owner, g.owner_row}, {Buf::kGuestOut, -1, g.row}, g.rows);
    }
    if (!layout.rows_copied_from(owner)) {
      out.copies.resize(begin);
      continue;
    }
    copies_step(out, Op::kCopyBatch, kCopyOut, begin);
    signal(out, SignalFamily::kRowsBack, owner, Value::kCall, kCopyOut);
  }
}

// The copied guests' rows kept for the backward (the arena is reused by the next call; one-hop
// rows landed in the kept rows already): after every guest's inputs landed, on the copy stream.
void keep_guest_rows(StepList& out, const StepLayout& layout, bool one_hop_guests) {
  const size_t begin = out.copies.size();
  if (!one_hop_guests) {
    copy(out, {Buf::kXGuest, -1, 0}, {Buf::kGuestIn, -1, 0}, layout.guest_rows_here());
  } else {
    for (const GuestWork& g : layout.guest_work()) {
      if (!g.dispatched) copy(out, {Buf::kXGuest, -1, g.row}, {Buf::kGuestIn, -1, g.row}, g.rows);
    }
  }
  copies_step(out, Op::kKeepGuestRows, kCopyOut, begin);
}

// Guests of a forward, owner by owner in the layout's order (each once its owner's copies
// landed), then their results back by copy engine.
void guests_forward(StepList& out, const StepLayout& layout, const CallFacts& f, Buf guest_x) {
  if (f.prefetched_here) prefetch_waits(out, f, kCompute);
  mark(out, Mark::kWaited, false);
  bool copied = false, one_hop = false;
  const auto guests = layout.guest_work();
  for (size_t i = 0; i < guests.size();) {
    const int owner = guests[i].owner;
    wait_owner(out, owner, /*backward=*/false);
    size_t end = i;
    while (end < guests.size() && guests[end].owner == owner) ++end;
    if (end == guests.size()) record(out, EventId::kGuestReady, kCompute);
    for (size_t k = i; k < end; ++k) (guests[k].dispatched ? one_hop : copied) = true;
    guest_gemms(out, guests, i, end, /*backward=*/false, guest_x);
    i = end;
  }
  if (guests.empty()) record(out, EventId::kGuestReady, kCompute);
  slots_quiet(out, &layout, f);
  mark(out, Mark::kGuest, false);
  record(out, EventId::kGuestDone, kCompute);
  if (f.training && copied) keep_guest_rows(out, layout, one_hop);
  wait_event(out, EventId::kGuestDone, kCopyOut);
  send_rows_back(out, layout);
  record(out, EventId::kCopyOutDone, kCopyOut);
}

// Guests of a backward: dX and dW owner by owner, then dX back (rows_back) and dW into the
// owners' staging slots (grads_back).
void guests_backward(StepList& out, const StepLayout& layout, const CallFacts& f) {
  wait_event(out, EventId::kGradsFree, kCompute);
  mark(out, Mark::kWaited, true);
  const auto guests = layout.guest_work();
  for (size_t i = 0; i < guests.size();) {
    const int owner = guests[i].owner;
    wait_owner(out, owner, /*backward=*/true);
    size_t end = i;
    while (end < guests.size() && guests[end].owner == owner) ++end;
    guest_gemms(out, guests, i, end, /*backward=*/true, Buf::kXGuest);
    i = end;
  }
  slots_quiet(out, &layout, f);
  mark(out, Mark::kGuest, true);
  record(out, EventId::kGuestDone, kCompute);
  wait_event(out, EventId::kGuestDone, kCopyOut);
  send_rows_back(out, layout);
  for (size_t i = 0; i < guests.size();) {
    const int owner = guests[i].owner;
    const size_t begin = out.copies.size();
    for (; i < guests.size() && guests[i].owner == owner; ++i) {
      copy(out, {Buf::kPeerStagingSlot, owner, guests[i].staging_slot},
           {Buf::kGradSlot, -1, guests[i].slot});
    }
    copies_step(out, Op::kCopyBatch, kCopyOut, begin);
    signal(out, SignalFamily::kGradsBack, owner, Value::kCall, kCopyOut);
  }
  record(out, EventId::kGradsFree, kCopyOut);
  record(out, EventId::kCopyOutDone, kCopyOut);
}

// The exported rows' results (kHome slices) back at home: the compute stream waits for each
// helper's rows_back.
void wait_rows_back(StepList& out, const StepLayout& layout, const CallFacts& f) {
  for (int h = 0; h < f.world; ++h) {
    if (layout.rows_copied_to(h)) wait(out, SignalFamily::kRowsBack, h, Value::kCall, kCompute);
  }
}

// Dispatched rows: the exported slices' results, once each helper's rows_back is in, into the
// caller's rows at the same positions.
void copy_exported_results(StepList& out, const StepLayout& layout, const CallFacts& f) {
  for (int h = 0; h < f.world; ++h) {
    if (layout.exports_to(h)) wait(out, SignalFamily::kRowsBack, h, Value::kCall, kCompute);
  }
  const size_t begin = out.copies.size();
  for (const Export& x : layout.exports()) {
    copy(out, {Buf::kCallerOut, -1, x.src_row}, {Buf::kResultsHome, -1, x.src_row}, x.rows);
  }
  copies_step(out, Op::kMemcpy, kCompute, begin);
}

// The exported slices' dW: the results' copy stream waits for each helper's grads_back and adds
// the staged gradients into the caller's.
void add_staged_grads(StepList& out, const StepLayout& layout, const CallFacts& f) {
  for (int h = 0; h < f.world; ++h) {
    if (layout.exports_to(h)) wait(out, SignalFamily::kGradsBack, h, Value::kCall, kCopyOut);
  }
  for (const Export& x : layout.exports()) {
    Step& s = add(out, Op::kKernel, kCopyOut);
    s.kernel = KernelId::kAddStagedGrad;
    s.a = {Buf::kGrads, -1, x.local_index};
    s.b = {Buf::kStagingSlot, -1, x.staging_slot};
  }
  record(out, EventId::kStagingFree, kCopyOut);
  record(out, EventId::kGradsDone, kCopyOut);
}

// GradMode::kOverwrite: the gradients of the local experts no home dW GEMM writes (all their
// rows computed on helpers, or none routed to them) are zeroed, before any staged add.
void zero_grads_without_home_work(StepList& out, const StepLayout& layout, const CallFacts& f) {
  const auto home = layout.home_work();
  for (int i = 0; i < f.experts_per_rank; ++i) {
    bool written = false;
    for (const HomeWork& hw : home) written = written || hw.local_index == i;
    if (written) continue;
    Step& s = add(out, Op::kKernel, kCompute);
    s.kernel = KernelId::kZeroGrads;
    s.a = {Buf::kGrads, -1, i};
  }
}

// The timeline of a call with nothing between its experts and its combine: every mark the
// statistics read, the empty spans zero.
void marks_after_experts(StepList& out, bool backward) {
  for (Mark m : {Mark::kStatic, Mark::kWaited, Mark::kGuest, Mark::kReturned})
    mark(out, m, backward);
}

void counted_gemms(StepList& out, bool backward, Buf in, Buf result, bool overwrite) {
  Step& s = add(out, Op::kCountedGemm, kCompute);
  s.backward = backward;
  s.a = {in, -1, 0};
  s.b = {result, -1, 0};
  s.overwrite = overwrite;
}

}  // namespace

void build_forward_prologue(StepList& out, const CallFacts& f) {
  out.clear();
  wait_event(out, EventId::kCallDone, kCompute);
  mark(out, Mark::kStart, false);
  if (f.settle && !f.prefetched_here) prefetch_waits(out, f, kCompute);
  if (f.dispatched) {
    host(out, HostAction::kStageCounts);
    // The rows per local expert, then the planner time (kStageCounts staged both).
    kernel(out, KernelId::kCountsFromCaller, kCompute, f.experts_per_rank + 1);
    all_gather(out, f.experts_per_rank + 1);
    mark(out, Mark::kCounts, false);
    mark(out, Mark::kCountsIssued, false);
    kernel(out, KernelId::kCountsToHost, kCompute, int64_t{f.world} * (f.experts_per_rank + 1));
  } else {
    host(out, HostAction::kCarveTokens);
    kernel(out, KernelId::kZeroCounts);
    kernel(out, KernelId::kCountExperts);
    kernel(out, KernelId::kSendOffsets);
    kernel(out, KernelId::kScatterRows);
    kernel(out, KernelId::kPlannerTime);
    all_gather(out, f.num_experts + 2);
    mark(out, Mark::kCounts, false);
    if (f.sync_before_counts) kernel(out, KernelId::kSyncCounts);
    mark(out, Mark::kCountsIssued, false);
    kernel(out, KernelId::kCountsToHost, kCompute, int64_t{f.world} * (f.num_experts + 2));
  }
  record(out, EventId::kCounts, kCompute);
  host(out, HostAction::kStartJob);
  await(out, HostFlag::kPlanned);
}

void build_forward_body(StepList& out, const StepLayout& layout, const CallFacts& f) {
  out.clear();
  if (!f.dispatched) {
    exchange(out, layout, /*reverse=*/false, Buf::kSend, Buf::kXHome, Buf::kGuestX);
  }
  record(out, EventId::kDispatched, kCompute);
  post(out, HostFlag::kDispatched);
  mark(out, Mark::kDispatched, false);
  home_gemms(out, layout, false, Buf::kXHome, Buf::kNone,
             f.dispatched ? Buf::kCallerOut : Buf::kResultsHome);
  mark(out, Mark::kStatic, false);
  guests_forward(out, layout, f, f.dispatched ? Buf::kGuestIn : Buf::kGuestX);
  if (f.dispatched) {
    copy_exported_results(out, layout, f);
    mark(out, Mark::kReturned, false);
  } else {
    wait_rows_back(out, layout, f);
    mark(out, Mark::kReturned, false);
    exchange(out, layout, /*reverse=*/true, Buf::kYSend, Buf::kResultsHome, Buf::kGuestOut);
    kernel(out, KernelId::kCombine);
  }
  finish_call(out, f);
  mark(out, Mark::kEnd, false);
  record(out, EventId::kCallDone, kCompute);
}

void build_forward_stop(StepList& out, const CallFacts& f) {
  out.clear();
  if (f.prefetched_here) prefetch_waits(out, f, kCompute);
  slots_quiet(out, nullptr, f);
  finish_call(out, f);
  record(out, EventId::kCallDone, kCompute);
}

void build_backward(StepList& out, const StepLayout& layout, const CallFacts& f) {
  out.clear();
  wait_event(out, EventId::kCallDone, kCompute);
  mark(out, Mark::kStart, true);
  if (f.settle) prefetch_waits(out, f, kCompute);
  wait_event(out, EventId::kStagingFree, kCompute);
  wait_event(out, EventId::kGradsDone, kCompute);
  if (f.overwrite_grads) zero_grads_without_home_work(out, layout, f);
  host(out, HostAction::kStartJob);
  if (!f.dispatched) kernel(out, KernelId::kScatterGrad);
  // The collective that orders this rank's phase-2 copies into its peers' arenas after the
  // peers' last use of them (an all-to-all alone does not: zero-byte chunks are never sent).
  all_gather(out, 1);
  if (!f.dispatched) {
    exchange(out, layout, /*reverse=*/false, Buf::kSend, Buf::kDyHome, Buf::kGuestIn);
  }
  record(out, EventId::kDispatched, kCompute);
  post(out, HostFlag::kDispatched);
  mark(out, Mark::kDispatched, true);
  home_gemms(out, layout, true, Buf::kXHome, f.dispatched ? Buf::kCallerIn : Buf::kDyHome,
             f.dispatched ? Buf::kCallerOut : Buf::kResultsHome, f.overwrite_grads);
  mark(out, Mark::kStatic, true);
  guests_backward(out, layout, f);
  if (f.dispatched) {
    copy_exported_results(out, layout, f);
  } else {
    wait_rows_back(out, layout, f);
  }
  mark(out, Mark::kReturned, true);
  add_staged_grads(out, layout, f);
  if (!f.dispatched) {
    exchange(out, layout, /*reverse=*/true, Buf::kBack, Buf::kResultsHome, Buf::kGuestOut);
    kernel(out, KernelId::kCombineGrad);
  }
  finish_call(out, f);
  mark(out, Mark::kEnd, true);
  record(out, EventId::kCallDone, kCompute);
}

void build_forward_one_rank(StepList& out) {
  out.clear();
  wait_event(out, EventId::kCallDone, kCompute);
  mark(out, Mark::kStart, false);
  host(out, HostAction::kCarveTokens);
  kernel(out, KernelId::kZeroCounts);
  kernel(out, KernelId::kCountExperts);
  kernel(out, KernelId::kSendOffsets);
  kernel(out, KernelId::kScatterRows);
  host(out, HostAction::kStageRowCounts);
  mark(out, Mark::kDispatched, false);
  counted_gemms(out, false, Buf::kXHome, Buf::kYSend, false);
  marks_after_experts(out, false);
  kernel(out, KernelId::kCombine);
  mark(out, Mark::kEnd, false);
  record(out, EventId::kCallDone, kCompute);
}

void build_backward_one_rank(StepList& out, bool overwrite_grads) {
  out.clear();
  wait_event(out, EventId::kCallDone, kCompute);
  mark(out, Mark::kStart, true);
  kernel(out, KernelId::kScatterGrad);
  mark(out, Mark::kDispatched, true);
  counted_gemms(out, true, Buf::kSend, Buf::kBack, overwrite_grads);
  marks_after_experts(out, true);
  kernel(out, KernelId::kCombineGrad);
  mark(out, Mark::kEnd, true);
  record(out, EventId::kCallDone, kCompute);
}

void build_inputs(StepList& out, const StepLayout& layout, const InputFacts& f, int rank) {
  out.clear();
  if (f.runs) {
    const auto exports = layout.exports();
    bool rows = f.backward;
    for (const Export& x : exports) rows = rows || !x.dispatched;
    if (rows) {
      // Phase-1 rows must have landed before they are copied on.
      await(out, HostFlag::kDispatched, kCopyIn);
      wait_event(out, EventId::kDispatched, kCopyIn);
    } else {
      // Weights only (rows in one hop): after the counts all-gather, which every rank's previous
      // call preceded, so the helpers' slots are free: the copies overlap phase 1.
      wait_event(out, EventId::kCounts, kCopyIn);
    }
    bool any = false;
    for (size_t i = 0; i < exports.size();) {
      const int helper = exports[i].helper;
      const size_t begin = out.copies.size();
      for (; i < exports.size() && exports[i].helper == helper; ++i) {
        const Export& x = exports[i];
        if (f.backward ? f.recopy[static_cast<size_t>(x.slice)] != 0
                       : !(x.prefetched && f.prefetched_here)) {
          copy(out, {Buf::kPeerGuestSlot, helper, x.slot}, {Buf::kWeights, -1, x.local_index});
        }
        if (x.dispatched) continue;
        copy(out, {Buf::kPeerGuestIn, helper, x.dst_row}, {f.rows, -1, x.src_row}, x.rows);
      }
      if (!f.backward && !any) mark(out, Mark::kFirstCopy, false, kCopyIn);
      any = any || out.copies.size() > begin;
      copies_step(out, Op::kCopyBatch, kCopyIn, begin);
      signal(out, SignalFamily::kInputsLanded, helper, Value::kCall, kCopyIn);
    }
  }
  (void)rank;
  // The planner observes the step (off the critical path; before the caller may call it again).
  if (f.observe) host(out, HostAction::kObserve, kCopyIn);
  record(out, EventId::kCopyInDone, kCopyIn);
  post(out, HostFlag::kCopiesOut, kCopyIn);
}

void build_prefetch(StepList& out, std::span<const PrefetchCopy> copies, bool any_predicted,
                    const CallFacts& f) {
  out.clear();
  wait_event(out, EventId::kCallDone, kCompute);
  if (f.settle) {  // an earlier prefetch that no forward used: drop it
    prefetch_waits(out, f, kCompute);
    slots_quiet(out, nullptr, f);
    wait_event(out, EventId::kPrefetchDone, kCompute);
    host(out, HostAction::kDropPrefetch);
  }
  if (!any_predicted) {  // nothing pending: every rank sees the same prediction
    record(out, EventId::kCallDone, kCompute);
    return;
  }
  host(out, HostAction::kStartPrefetch);
  // This rank's copies, helper by helper, after the stream's prior work, on the phase-2 inputs'
  // copy stream (the next forward's copies queue behind them, as the planner's links do).
  record(out, EventId::kPrefetchReady, kCompute);
  wait_event(out, EventId::kPrefetchReady, kCopyIn);
  for (int g = 0; g < f.world; ++g) {
    const size_t begin = out.copies.size();
    for (const PrefetchCopy& c : copies) {
      if (c.helper == g)
        copy(out, {Buf::kPeerGuestSlot, g, c.slot}, {Buf::kWeights, -1, c.local_index});
    }
    if (out.copies.size() == begin) continue;
    // After the helper's slots are quiet (skipped while nothing ever used them: value 0).
    wait(out, SignalFamily::kSlotsQuiet, g, Value::kQuiet, kCopyIn);
    copies_step(out, Op::kCopyBatch, kCopyIn, begin);
    signal(out, SignalFamily::kPrefetchLanded, g, Value::kCall, kCopyIn);
  }
  record(out, EventId::kPrefetchDone, kCopyIn);
  record(out, EventId::kCallDone, kCompute);
}

}  // namespace feplb::cuda
