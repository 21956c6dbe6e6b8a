// The host side of the layer's calls around their step programs: numbering the call, settling a
// pending prefetch, the micro-batch's memory, the scheduler's job, the plan's checks, and the
// host work the programs call back for (ProgramHooks).
#include <algorithm>
#include <atomic>

#include "feplb/cuda/base/check.h"
#include "feplb/cuda/layer/layer_impl.h"

namespace feplb::cuda {
namespace {

double us_between(std::chrono::steady_clock::time_point a,
                  std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

// Hands out 256-byte aligned pieces of one allocation; with a null base it only measures.
class Carver {
 public:
  explicit Carver(void* base) : base_(static_cast<char*>(base)) {}
  template <typename T>
  T* take(int64_t count) {
    off_ = (off_ + 255) & ~size_t{255};
    T* p = base_ ? reinterpret_cast<T*>(base_ + off_) : nullptr;
    off_ += static_cast<size_t>(count) * sizeof(T);
    return p;
  }
  size_t bytes() const { return off_; }

 private:
  char* base_;
  size_t off_ = 0;
};

// GEMM kernels the runtime enqueued so far: per-expert cuBLASLt GEMMs and grouped GEMMs.
int64_t gemm_launches(const RuntimeState& r) {
  return r.ffn.gemm.launches() + (r.ffn.grouped ? r.ffn.grouped->gemm_launches() : 0);
}

}  // namespace

MoeLayer::Impl::Impl(std::shared_ptr<EpRuntime::State> runtime, const LayerConfig& config,
                     std::unique_ptr<Planner> p)
    : rt(std::move(runtime)),
      cfg(config),
      planner(std::move(p)),
      exec(CallParts(*rt), cfg.name, ev_grads_done, forward_timeline, backward_timeline),
      sched_exec(CallParts(*rt), cfg.name, ev_grads_done, forward_timeline, backward_timeline) {
  if (rt->world == 1) make_capture_sink();
}

void MoeLayer::Impl::start_host(Bindings& b) {
  call_host = HostTimes{};
  b.host = &call_host;
  b.planner_us = planner_us.get();
  call_start = Clock::now();
  call_gemms0 = gemm_launches(*rt);
}

HostTimes MoeLayer::Impl::finish_host() {
  call_host.call_us = us_between(call_start, Clock::now());
  call_host.gemms = gemm_launches(*rt) - call_gemms0;
  return call_host;
}

CallFacts MoeLayer::Impl::facts(bool dispatched) const {
  const RuntimeState& r = *rt;
  CallFacts f;
  f.rank = r.rank;
  f.world = r.world;
  f.num_experts = static_cast<int>(r.E);
  f.experts_per_rank = r.experts_per_rank;
  f.training = r.cfg.training;
  f.sync_before_counts = r.cfg.sync_before_counts;
  f.dispatched = dispatched;
  f.settle = r.calls.pending.active;
  f.prefetch_into_here = r.calls.pending.into_here;
  f.prefetch_targets = r.calls.pending.targets;
  return f;
}

// Hands the call to the scheduler (HostAction::kStartJob posts it).
void MoeLayer::Impl::begin_job(MicroBatchState& h, bool backward, bool dispatched,
                               std::span<const ExpertParams> w) {
  experts.assign(w.begin(), w.end());
  job.h = &h;
  job.seq = rt->board->call();
  job.backward = backward;
  job.dispatched = dispatched;
  job.runs = backward;  // a forward's job decides once it has the plan
  job.planned = false;
  job.error.clear();
  if (!backward) {  // forward: the rows at home (forward_dispatched: the caller's, bound there)
    job.rows = Buf::kXHome;
    job.caller_rows = nullptr;
  }
}

// The start of a forward (forward(), forward_dispatched()): a micro-batch slot for `handle` (from
// here on, an exception gives its memory back) holding `rows` rows, the call's number. A pending
// prefetch is settled by the call (`f.settle`): this layer's forward uses its weights (the guests
// wait for them); any other layer's drops it, waiting for its copies into this rank before the
// counts all-gather, the collective that orders this call's copies into peers' slots after them.
MicroBatchState& MoeLayer::Impl::begin_forward(MicroBatch& handle, int64_t rows, bool dispatched,
                                               Bindings& b, CallFacts& f) {
  RuntimeState& r = *rt;
  if (handle.slot_ < 0) acquire_batch(handle, rows, dispatched);
  MicroBatchState& h = r.batches.states[static_cast<size_t>(handle.slot_)];
  const uint32_t seq = r.board->next_call();
  h.forward_seq = seq;
  h.stream = b.stream;
  b.mb = &h;
  b.call = seq;
  f = facts(dispatched);
  f.prefetched_here = f.settle && r.calls.pending.layer_id == layer_id;
  job.prefetched = f.prefetched_here;
  return h;
}

void MoeLayer::Impl::acquire_batch(MicroBatch& handle, int64_t rows, bool dispatched) {
  RuntimeState& r = *rt;
  int slot = -1;
  try {
    slot = r.acquire(layer_id);
  } catch (const InputError&) {
    if (!r.call_queue || r.call_queue->on_call_thread()) throw;
    r.drain_calls();  // dropped handles' memory given back
    slot = r.acquire(layer_id);
  }
  handle.rt_ = rt;
  handle.slot_ = slot;
  MicroBatchState& h = r.batches.states[static_cast<size_t>(slot)];
  handle.generation_ = h.generation;  // from here on, an exception gives the memory back
  h.num_tokens = rows;
  h.dispatched = dispatched;
}

MicroBatch MoeLayer::Impl::adopt(int slot, uint64_t generation) const {
  MicroBatch handle;
  if (slot < 0) return handle;
  handle.rt_ = rt;
  handle.slot_ = slot;
  handle.generation_ = generation;
  return handle;
}

// After the plan (HostFlag::kPlanned): a forward whose plan cannot run stops here on every rank
// alike (they see the same counts and plan); the scheduler issued nothing for it, so the runtime
// stays usable.
void MoeLayer::Impl::check_plan(const MicroBatchState& h, const CallFacts& f, Bindings& b) {
  const RuntimeState& r = *rt;
  std::string input_error, error;
  if (job.bad_ids > 0) {
    input_error = fmt::format(
        "forward of layer '{}': rank {} routed {} (token, k) pairs to expert ids outside "
        "[0, {}) (topk_idx out of range)",
        cfg.name, job.bad_rank, job.bad_ids, r.E);
  } else {
    if (!f.dispatched) {
      int64_t sent = 0;
      for (int e = 0; e < r.E; ++e) sent += h.routing.at(r.rank, e);
      FEPLB_CHECK(sent == b.num_tokens * K,
                  "layer '{}': counted {} rows, expected tokens * top_k = {}", cfg.name, sent,
                  b.num_tokens * K);
    }
    if (!h.layout.fits()) input_error = fmt::format("layer '{}': {}", cfg.name, h.layout.error());
    if (!job.error.empty()) error = job.error;
    if (f.dispatched && !error.empty()) input_error.clear();   // the plan's mismatch first
    if (!f.dispatched && !input_error.empty()) error.clear();  // the capacity first
  }
  if (input_error.empty() && error.empty()) return;
  build_forward_stop(body, f);
  exec.run(body, b, *this);
  if (!input_error.empty()) throw InputError(input_error);
  throw Error(error);
}

// Saved per plan: rows at home (`home_rows`; not carved when `own_x_home` is false: the caller's
// dispatched rows) and of guests, with their gate|up and activations, one allocation on `s`.
void MoeLayer::Impl::carve_plan(MicroBatchState& h, int64_t home_rows, bool own_x_home,
                                cudaStream_t s) {
  RuntimeState& r = *rt;
  const int64_t H = r.H, F = r.F;
  const int64_t guest = h.layout.guest_rows_here();
  const auto carve = [&](void* base) {
    Carver c(base);
    if (own_x_home) h.x_home = c.take<bf16>(home_rows * H);
    h.gu_home = c.take<bf16>(home_rows * 2 * F);
    h.act_home = c.take<bf16>(home_rows * F);
    h.x_guest = r.cfg.training ? c.take<bf16>(guest * H) : nullptr;
    h.gu_guest = c.take<bf16>(guest * 2 * F);
    h.act_guest = c.take<bf16>(guest * F);
    return c.bytes();
  };
  h.bytes_plan = home_rows + guest ? carve(nullptr) : 0;
  h.mem_plan = r.allocate(h.bytes_plan, s);
  carve(h.mem_plan);
}

// The forward once planned: its program, then the layer's last statistics, plan and routing; a
// forward-only runtime keeps nothing in `handle`.
void MoeLayer::Impl::run_forward_body(MicroBatch& handle, MicroBatchState& h, const CallFacts& f,
                                      Bindings& b) {
  timed(call_host.build_us, [&] { build_forward_body(body, h.layout, f); });
  exec.run(body, b, *this);
  fstats = h.stats;
  last_plan = h.plan;
  last_routing = h.routing;
  // Row counts met for the first time: their exact GEMM algorithms chosen in the background.
  timed(call_host.refine_us, [&] { rt->ffn.refiner.take(rt->ffn.gemm); });
  fstats.host = finish_host();
  if (!rt->cfg.training) handle.release();  // forward only: nothing to keep
}

// A backward of micro-batch `h`: the call's number, the guest weights to copy again (slots
// another call has filled since the forward; the same bookkeeping on every rank), its program,
// then the micro-batch's saved activations given back (after this backward's work on the stream).
void MoeLayer::Impl::run_backward(MicroBatch& mb, MicroBatchState& h, GradMode mode, Bindings& b) {
  if (h.one_rank) return run_backward_one_rank(mb, h, mode, b);
  RuntimeState& r = *rt;
  b.call = r.board->next_call();
  b.mb = &h;
  bstats = BackwardStats{};
  CallFacts f = facts(h.dispatched);
  f.overwrite_grads = mode == GradMode::kOverwrite;
  job.recopy.assign(h.plan.slices.size(), 0);
  for (const SlotUse& u : h.layout.slot_uses()) {
    uint64_t& held = r.pool->holder(u.rank, u.slot);
    const uint64_t want = ExpertSlotPool::tag(layer_id, u.expert, h.forward_seq);
    job.recopy[static_cast<size_t>(u.slice)] = held != want;
    if (held != want && r.cfg.topo.home(u.expert) == r.rank) ++bstats.weight_recopies;
    held = want;
  }
  job.rows = h.dispatched ? Buf::kCallerIn : Buf::kDyHome;
  job.caller_rows = b.caller_in;
  begin_job(h, /*backward=*/true, h.dispatched, b.experts);
  int64_t result_copies = 0;  // the caller's copies (the scheduler counts its own)
  b.copies = &result_copies;
  b.guest_rows = &bstats.guest_rows;
  timed(call_host.build_us, [&] { build_backward(body, h.layout, f); });
  exec.run(body, b, *this);
  bstats.copies += result_copies;
  r.release(mb.slot_, mb.generation_, b.stream);
  mb.release();
  timed(call_host.refine_us, [&] { r.ffn.refiner.take(r.ffn.gemm); });
  bstats.host = finish_host();
}

void MoeLayer::Impl::host(HostAction action, Bindings& b) {
  RuntimeState& r = *rt;
  switch (action) {
    case HostAction::kCarveTokens: {  // saved per token: pair positions, outputs in send order
      MicroBatchState& h = *b.mb;     // (one rank: everything, its rows at home included)
      const int64_t pairs = carve_pairs;
      const auto carve = [&](void* base) {
        Carver cv(base);
        h.pair_pos = cv.take<int32_t>(pairs);
        h.y_send = cv.take<bf16>(pairs * r.H);
        if (h.one_rank) {
          h.x_home = cv.take<bf16>(pairs * r.H);
          h.gu_home = cv.take<bf16>(pairs * 2 * r.F);
          h.act_home = cv.take<bf16>(pairs * r.F);
          h.expert_rows = cv.take<int32_t>(r.E + 1);
          h.expert_row0 = cv.take<int32_t>(r.E);
        }
        return cv.bytes();
      };
      h.bytes_tokens = pairs || h.one_rank ? carve(nullptr) : 0;
      h.mem_tokens = r.allocate(h.bytes_tokens, b.stream);
      carve(h.mem_tokens);
      break;
    }
    case HostAction::kStageCounts:  // the previous call's D2H into the pinned buffer is done
      for (int i = 0; i < r.experts_per_rank; ++i)
        r.arena.counts_host.get()[i] =
            static_cast<int32_t>(rows_per_expert[static_cast<size_t>(i)]);
      r.arena.counts_host.get()[r.experts_per_rank] =
          std::atomic_ref<int32_t>(*planner_us.get()).load(std::memory_order_relaxed);
      break;
    case HostAction::kStartJob:
      r.scheduler.post(&Impl::run_job, this);
      break;
    case HostAction::kDropPrefetch:
      r.calls.pending.active = false;
      break;
    case HostAction::kStartPrefetch: {
      const uint32_t seq = r.board->next_call();
      b.call = seq;
      PendingPrefetch& p = r.calls.pending;
      p.active = true;
      p.layer_id = layer_id;
      p.seq = seq;
      p.copies.assign(predicted.begin(), predicted.end());
      p.slots.assign(pre_slot.begin(), pre_slot.end());
      std::fill(p.into_here.begin(), p.into_here.end(), uint8_t{0});
      std::fill(p.targets.begin(), p.targets.end(), uint8_t{0});
      for (size_t i = 0; i < p.copies.size(); ++i) {
        const Copy& c = p.copies[i];
        p.targets[static_cast<size_t>(c.dst_gpu)] = 1;
        if (c.dst_gpu == r.rank) p.into_here[static_cast<size_t>(c.src_gpu)] = 1;
        r.pool->holder(c.dst_gpu, p.slots[i]) = ExpertSlotPool::tag(layer_id, c.expert, seq);
      }
      break;
    }
    case HostAction::kStageRowCounts:
      if (b.captured) {
        stage_captured_counts(b);
      } else {
        stage_row_counts(b);
      }
      break;
    case HostAction::kObserve:  // scheduler thread
      planner->observe(job.h->routing);
      job.planned = false;
      break;
  }
}

void MoeLayer::Impl::marked(Mark mark, bool backward, Clock::time_point t) {
  if (backward || mark != Mark::kFirstCopy) return;
  ForwardStats& s = job.h->stats;  // scheduler thread, before HostFlag::kCopiesOut
  s.counts_to_first_copy_us = us_between(forward_timeline.host(Mark::kCountsIssued), t);
  s.plan_to_first_copy_us = us_between(job.plan_ready, t);
}

// Weights before routing: the planner's predicted pairs, checked, then the prefetch's program.
void MoeLayer::Impl::run_prefetch(std::span<const ExpertParams> w, cudaStream_t stream) {
  RuntimeState& r = *rt;
  const int R = r.world;
  predicted = planner->prefetch(layer_id);
  prefetch_slots(predicted, R, pre_slot, pre_next);
  pre_copies.clear();
  const auto local = r.cfg.topo.local_experts(r.rank);
  for (size_t i = 0; i < predicted.size(); ++i) {
    const Copy& c = predicted[i];
    const bool ok = c.kind == CopyKind::kPrefetchWeights && c.expert >= 0 && c.expert < r.E &&
                    c.dst_gpu >= 0 && c.dst_gpu < R && c.src_gpu == r.cfg.topo.home(c.expert) &&
                    c.dst_gpu != c.src_gpu && pre_slot[i] < r.pool->slots();
    FEPLB_REQUIRE_INPUT(
        ok,
        "prefetch of layer '{}': planner '{}' predicts a copy of expert {} from GPU {} to GPU {} "
        "the "
        "runtime cannot make (weights from the expert's home to another GPU, at most {} per GPU)",
        cfg.name, planner->name(), c.expert, c.src_gpu, c.dst_gpu, r.pool->slots());
    if (c.src_gpu != r.rank) continue;
    const int li =
        static_cast<int>(std::find(local.begin(), local.end(), c.expert) - local.begin());
    pre_copies.push_back({li, c.dst_gpu, pre_slot[i]});
  }
  CallFacts f = facts(false);
  build_prefetch(body, pre_copies, !predicted.empty(), f);
  Bindings b;
  b.stream = stream;
  b.experts = w;
  b.call = r.board->call();
  exec.run(body, b, *this);
}

}  // namespace feplb::cuda
