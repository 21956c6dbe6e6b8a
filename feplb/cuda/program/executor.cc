#include "feplb/cuda/program/executor.h"

#include <chrono>

#include "feplb/cuda/base/check.h"
#include "feplb/cuda/base/spin_wait.h"
#include "feplb/cuda/gemm/expert_ffn.h"
#include "feplb/cuda/kernels/kernels.h"
#include "feplb/cuda/runtime/runtime_state.h"

namespace feplb::cuda {
namespace {

const char* flag_what(HostFlag flag) {
  switch (flag) {
    case HostFlag::kPlanned:
      return "plan";
    case HostFlag::kDispatched:
      return "phase-1 dispatch";
    case HostFlag::kCopiesOut:
      return "phase-2 copies";
  }
  return "?";
}

std::atomic<uint32_t>& host_flag(CallOrder& calls, HostFlag flag) {
  switch (flag) {
    case HostFlag::kPlanned:
      return calls.plan_seq;
    case HostFlag::kDispatched:
      return calls.dispatched_seq;
    case HostFlag::kCopiesOut:
      break;
  }
  return calls.copies_seq;
}

}  // namespace

Executor::Executor(CallParts rt, const std::string& name, Event& grads_done, Timeline& forward,
                   Timeline& backward)
    : rt_(rt), name_(name), grads_done_(grads_done), forward_(forward), backward_(backward) {}

void Executor::run(const StepList& list, Bindings& b, ProgramHooks& hooks) {
  if (!b.host) {
    for (const Step& s : list.steps) step(list, s, b, hooks);
    return;
  }
  using Clock = std::chrono::steady_clock;
  HostTimes& t = *b.host;
  auto t0 = Clock::now();
  for (const Step& s : list.steps) {
    step(list, s, b, hooks);
    const auto t1 = Clock::now();
    const double us = std::chrono::duration<double, std::micro>(t1 - t0).count();
    t0 = t1;
    switch (s.op) {
      case Op::kAwait:
        t.await_us += us;
        break;
      case Op::kGemm:
      case Op::kCountedGemm:
        t.gemm_us += us;
        break;
      case Op::kHost:
        t.hooks_us += us;
        break;
      case Op::kKernel:
        t.kernel_us += us;
        break;
      case Op::kAllGather:
      case Op::kExchange:
      case Op::kCopyBatch:
      case Op::kMemcpy:
      case Op::kKeepGuestRows:
        t.exchange_us += us;
        break;
      default:
        t.sync_us += us;
    }
  }
}

void Executor::await(HostFlag flag, uint32_t call) const {
  using Clock = std::chrono::steady_clock;
  const std::atomic<uint32_t>& seq = host_flag(rt_.calls, flag);
  const auto deadline = Clock::now() + std::chrono::duration<double>(rt_.cfg.timeout_s);
  for (uint64_t spins = 0; seq.load(std::memory_order_acquire) < call; ++spins) {
    if (rt_.calls.failed.load(std::memory_order_acquire)) std::rethrow_exception(rt_.calls.error);
    if ((spins & 16383) == 16383) rt_.check_peers(flag_what(flag));
    if ((spins & 1023) == 0 && Clock::now() > deadline) {
      throw Error(fmt::format("layer '{}' rank {}: waited {:.0f} s for the scheduler ({})", name_,
                              rt_.rank, rt_.cfg.timeout_s, flag_what(flag)));
    }
    spin_pause(spins);
  }
}

void Executor::step(const StepList& list, const Step& s, Bindings& b, ProgramHooks& hooks) {
  const cudaStream_t st = stream(s.stream, b);
  switch (s.op) {
    case Op::kKernel:
      kernel(s, b, st);
      break;
    case Op::kAllGather:
      rt_.transport.all_gather_i32(rt_.arena.counts.get(), rt_.arena.counts_all.get(),
                                   static_cast<size_t>(s.count), st);
      break;
    case Op::kExchange:
      exchange(list, s, b, st);
      break;
    case Op::kGemm:
      gemms(list, s, b, st);
      break;
    case Op::kCountedGemm:
      counted_gemms(s, b, st);
      break;
    case Op::kCopyBatch:
      copy_batch(list, s, b, st);
      break;
    case Op::kMemcpy:
      memcpys(list, s, b, st);
      break;
    case Op::kKeepGuestRows:
      if (!b.mb->x_guest) break;  // a forward-only runtime keeps no guest rows
      FEPLB_CUDA_CHECK(cudaStreamWaitEvent(st, event(EventId::kGuestReady), 0));
      memcpys(list, s, b, st);
      break;
    case Op::kSignal:
      rt_.board.signal(s.family, s.peer, value(s.value, rt_.rank, b), st);
      break;
    case Op::kWait:
      wait(s, b, st);
      break;
    case Op::kBumpQuiet:
      rt_.board.bump_quiet(s.peer);
      break;
    case Op::kRecord:
      FEPLB_CUDA_CHECK(
          cudaEventRecordWithFlags(event(s.event), st, b.captured ? cudaEventRecordExternal : 0));
      break;
    case Op::kWaitEvent:
      FEPLB_CUDA_CHECK(
          cudaStreamWaitEvent(st, event(s.event), b.captured ? cudaEventWaitExternal : 0));
      break;
    case Op::kPost:
      host_flag(rt_.calls, s.flag).store(b.call, std::memory_order_release);
      break;
    case Op::kAwait:
      await(s.flag, b.call);
      break;
    case Op::kMark:
      mark(s, st, b.captured, hooks);
      break;
    case Op::kHost:
      hooks.host(s.action, b);
      break;
  }
}

void Executor::kernel(const Step& s, Bindings& b, cudaStream_t st) {
  CallParts& r = rt_;
  const int E = static_cast<int>(r.E);
  const int64_t H = r.H, F = r.F, pairs = b.num_tokens * b.top_k;
  MicroBatchState* h = b.mb;
  // A one-rank forward counts into its micro-batch (kept for its backward) and scatters its rows
  // straight to their place at home; otherwise into the runtime's counts and send rows.
  const bool one_rank = h && h->one_rank;
  int32_t* counts = one_rank ? h->expert_rows : r.arena.counts.get();
  int32_t* offsets = one_rank ? h->expert_row0 : r.arena.offsets.get();
  switch (s.kernel) {
    case KernelId::kZeroCounts:
      FEPLB_CUDA_CHECK(cudaMemsetAsync(
          counts, 0,
          one_rank ? static_cast<size_t>(E + 1) * sizeof(int32_t) : r.arena.counts.bytes(), st));
      break;
    case KernelId::kCountExperts:
      FEPLB_CUDA_CHECK(kernels::count_experts(b.topk_idx, pairs, E, counts,
                                              r.arena.chunk_rows.get(), h->pair_pos, st));
      break;
    case KernelId::kPlannerTime:  // read when the copy runs: any rank's value is agreed by all
      if (b.planner_us)
        FEPLB_CUDA_CHECK(cudaMemcpyAsync(r.arena.counts.get() + E + 1, b.planner_us,
                                         sizeof(int32_t), cudaMemcpyHostToDevice, st));
      break;
    case KernelId::kSendOffsets:
      FEPLB_CUDA_CHECK(kernels::send_offsets(counts, r.arena.order.get(), E, pairs, offsets,
                                             r.arena.chunk_rows.get(), st));
      break;
    case KernelId::kScatterRows:
      FEPLB_CUDA_CHECK(kernels::scatter_rows(
          b.hidden, b.topk_idx, b.num_tokens, b.top_k, E, H, r.arena.chunk_rows.get(),
          one_rank ? h->x_home : r.arena.send.get(), h->pair_pos, st));
      break;
    case KernelId::kScatterGrad:
      FEPLB_CUDA_CHECK(kernels::scatter_grad(b.grad_out, h->pair_pos, b.topk_weight, h->y_send,
                                             b.num_tokens, b.top_k, H, r.arena.send.get(),
                                             b.grad_topk_weight, st));
      break;
    case KernelId::kCombine:
      FEPLB_CUDA_CHECK(kernels::combine(h->y_send, h->pair_pos, b.topk_weight, b.num_tokens,
                                        b.top_k, H, b.out, st));
      break;
    case KernelId::kCombineGrad:
      FEPLB_CUDA_CHECK(kernels::combine(r.arena.ybuf.get(), h->pair_pos, nullptr, b.num_tokens,
                                        b.top_k, H, b.out, st));
      break;
    case KernelId::kZeroGrads:  // one expert's, in its gradients' dtype
      zero_grads(b.grads[static_cast<size_t>(s.a.index)], st);
      break;
    case KernelId::kAddStagedGrad: {
      const float* staged = r.pool.staging_slot(static_cast<int>(s.b.index));
      const ExpertGrads& g = b.grads[static_cast<size_t>(s.a.index)];
      if (g.bf16_pair()) {
        FEPLB_CUDA_CHECK(kernels::add_f32_to_bf16(g.gate_up_bf16, staged, 2 * H * F, st));
        FEPLB_CUDA_CHECK(kernels::add_f32_to_bf16(g.down_bf16, staged + 2 * H * F, H * F, st));
      } else {
        FEPLB_CUDA_CHECK(kernels::add_f32(g.gate_up, staged, 2 * H * F, st));
        FEPLB_CUDA_CHECK(kernels::add_f32(g.down, staged + 2 * H * F, H * F, st));
      }
      break;
    }
    case KernelId::kCountsFromCaller:
      FEPLB_CUDA_CHECK(cudaMemcpyAsync(r.arena.counts.get(), r.arena.counts_host.get(),
                                       static_cast<size_t>(s.count) * sizeof(int32_t),
                                       cudaMemcpyHostToDevice, st));
      break;
    case KernelId::kCountsToHost:
      FEPLB_CUDA_CHECK(cudaMemcpyAsync(r.arena.counts_host.get(), r.arena.counts_all.get(),
                                       static_cast<size_t>(s.count) * sizeof(int32_t),
                                       cudaMemcpyDeviceToHost, st));
      break;
    case KernelId::kSyncCounts:
      r.sync(st, "the counts all-gather");
      break;
  }
}

void Executor::exchange(const StepList& list, const Step& s, const Bindings& b, cudaStream_t st) {
  const size_t row_bytes = static_cast<size_t>(rt_.H) * sizeof(bf16);
  sends_.clear();
  recvs_.clear();
  for (uint32_t i = s.begin; i < s.end; ++i) {
    const ExchangeItem& x = list.exchanges[i];
    (i < s.mid ? sends_ : recvs_)
        .push_back({x.peer, rows(x.at, b), static_cast<size_t>(x.rows) * row_bytes});
  }
  rt_.transport.exchange(sends_, recvs_, st);
}

void Executor::copy_batch(const StepList& list, const Step& s, Bindings& b, cudaStream_t st) {
  CallParts& r = rt_;
  const int64_t H = r.H, F = r.F;
  batch_.clear();
  int64_t weights = 0;
  for (uint32_t i = s.begin; i < s.end; ++i) {
    const CopyItem& c = list.copies[i];
    if (c.src.buf == Buf::kWeights) {  // into a peer's guest weight slot
      const ExpertParams& w = b.experts[static_cast<size_t>(c.src.index)];
      bf16* slot = r.pool.peer_slot(c.dst.rank, static_cast<int>(c.dst.index));
      batch_.push_back({slot, w.gate_up, static_cast<size_t>(2 * H * F) * sizeof(bf16)});
      batch_.push_back({slot + 2 * H * F, w.down, static_cast<size_t>(H * F) * sizeof(bf16)});
      ++weights;
    } else if (c.src.buf == Buf::kGradSlot) {  // into a peer's gradient staging slot
      batch_.push_back({r.pool.peer_staging_slot(c.dst.rank, static_cast<int>(c.dst.index)),
                        r.pool.grad_slot(static_cast<int>(c.src.index)),
                        static_cast<size_t>(expert_weight_elems(H, F)) * sizeof(float)});
    } else {
      batch_.push_back(
          {rows(c.dst, b), rows(c.src, b), static_cast<size_t>(c.rows * H) * sizeof(bf16)});
    }
  }
  ce_copy_and_signal(st, batch_, nullptr, 0);
  if (b.copies) *b.copies += static_cast<int64_t>(batch_.size());
  if (b.weight_copies) *b.weight_copies += weights;
}

void Executor::memcpys(const StepList& list, const Step& s, const Bindings& b, cudaStream_t st) {
  for (uint32_t i = s.begin; i < s.end; ++i) {
    const CopyItem& c = list.copies[i];
    FEPLB_CUDA_CHECK(cudaMemcpyAsync(rows(c.dst, b), rows(c.src, b),
                                     static_cast<size_t>(c.rows * rt_.H) * sizeof(bf16),
                                     cudaMemcpyDeviceToDevice, st));
  }
}

// A wait whose value is 0 is skipped: no signal of value 0 is ever raised (slots_quiet of a rank
// whose slots no call has used yet).
void Executor::wait(const Step& s, const Bindings& b, cudaStream_t st) {
  const uint32_t v = value(s.value, s.peer, b);
  if (v == 0) return;
  Timeline& t = s.backward ? backward_ : forward_;
  const bool gpu = rt_.cfg.timing;
  if (s.timed) t.wait_begin(st, gpu);
  rt_.board.wait(s.family, s.peer, v, st);
  if (s.timed) t.wait_end(st, gpu);
}

void Executor::mark(const Step& s, cudaStream_t st, bool captured, ProgramHooks& hooks) {
  Timeline& t = s.backward ? backward_ : forward_;
  // Host-clock marks and a timed runtime's GPU marks; kCountsIssued is host only, and so is every
  // mark of a captured call (its GPU times are the replays', which no call reads).
  t.mark(s.mark, st, rt_.cfg.timing && !captured && s.mark != Mark::kCountsIssued);
  hooks.marked(s.mark, s.backward, t.host(s.mark));
}

cudaStream_t Executor::stream(StreamId id, const Bindings& b) const {
  switch (id) {
    case StreamId::kCompute:
      return b.stream;
    case StreamId::kCopyIn:
      return rt_.streams.copy_in.get();
    case StreamId::kCopyOut:
      return rt_.streams.copy_out.get();
  }
  return b.stream;
}

cudaEvent_t Executor::event(EventId id) const {
  switch (id) {
    case EventId::kCounts:
      return rt_.streams.ev_counts.get();
    case EventId::kDispatched:
      return rt_.streams.ev_dispatched.get();
    case EventId::kCopyInDone:
      return rt_.streams.ev_copy_in_done.get();
    case EventId::kGuestReady:
      return rt_.streams.ev_guest_ready.get();
    case EventId::kGuestDone:
      return rt_.streams.ev_guest_done.get();
    case EventId::kCopyOutDone:
      return rt_.streams.ev_copy_out_done.get();
    case EventId::kCallDone:
      return rt_.streams.ev_call_done.get();
    case EventId::kPrefetchReady:
      return rt_.streams.ev_prefetch_ready.get();
    case EventId::kPrefetchDone:
      return rt_.streams.ev_prefetch_done.get();
    case EventId::kStagingFree:
      return rt_.pool.staging_free();
    case EventId::kGradsFree:
      return rt_.pool.grads_free();
    case EventId::kGradsDone:
      return grads_done_.get();
  }
  return nullptr;
}

uint32_t Executor::value(Value v, int peer, const Bindings& b) const {
  switch (v) {
    case Value::kCall:
      return b.call;
    case Value::kQuiet:
      return rt_.board.quiet(peer);
    case Value::kPrefetch:
      return rt_.calls.pending.seq;
  }
  return b.call;
}

bf16* Executor::rows(const Ref& ref, const Bindings& b) const {
  const CallParts& r = rt_;
  const MicroBatchState* h = b.mb;
  bf16* base = nullptr;
  switch (ref.buf) {
    case Buf::kSend:
      base = r.arena.send.get();
      break;
    case Buf::kBack:
      base = r.arena.ybuf.get();
      break;
    case Buf::kDyHome:
      base = r.arena.dyrecv.get();
      break;
    case Buf::kResultsHome:
      base = r.arena.yrecv.get();
      break;
    case Buf::kGuestIn:
      base = r.arena.guest_in.get();
      break;
    case Buf::kGuestOut:
      base = r.arena.guest_out.get();
      break;
    case Buf::kXHome:
      base = h->x_home;
      break;
    case Buf::kGuestX:
      base = h->x_guest ? h->x_guest : r.arena.guest_in.get();
      break;
    case Buf::kXGuest:
      base = h->x_guest;
      break;
    case Buf::kYSend:
      base = h->y_send;
      break;
    case Buf::kCallerIn:
      base = const_cast<bf16*>(b.caller_in);
      break;
    case Buf::kCallerOut:
      base = b.caller_out;
      break;
    case Buf::kPeerGuestIn:
      base = r.arena.peer_guest_in[static_cast<size_t>(ref.rank)];
      break;
    case Buf::kPeerResultsHome:
      base = r.arena.peer_yrecv[static_cast<size_t>(ref.rank)];
      break;
    default:
      throw Error(fmt::format("step program: buffer {} is not a row buffer", buf_name(ref.buf)));
  }
  return base + ref.index * r.H;
}

}  // namespace feplb::cuda
