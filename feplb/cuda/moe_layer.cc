#include "feplb/cuda/moe_layer.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "feplb/cuda/ce_copy.h"
#include "feplb/cuda/check.h"
#include "feplb/cuda/expert_ffn.h"
#include "feplb/cuda/internal/runtime_state.h"
#include "feplb/cuda/kernels/kernels.h"
#include "feplb/cuda/spin_wait.h"

namespace feplb::cuda {

using Clock = std::chrono::steady_clock;

// Host time a forward or backward may spend, after enqueueing its GPU work, choosing exact GEMM
// algorithms for row counts it met for the first time (feplb/cuda/gemm.h).
constexpr double kGemmRefineBudgetMs = 1.0;

namespace {

double us_between(Clock::time_point a, Clock::time_point b) {
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

// One call of a runtime at a time: marks it busy, and idle again when the call leaves (also by
// an exception).
class CallGuard {
 public:
  CallGuard(RuntimeState& rt, const char* who) : rt_(rt) {
    FEPLB_REQUIRE_INPUT(!rt_.in_call.exchange(true, std::memory_order_acq_rel),
                        "{}: another call of this runtime is running (calls of one rank's runtime "
                        "must not overlap)",
                        who);
  }
  ~CallGuard() { rt_.in_call.store(false, std::memory_order_release); }
  CallGuard(const CallGuard&) = delete;
  CallGuard& operator=(const CallGuard&) = delete;

 private:
  RuntimeState& rt_;
};

// Planners whose plans the GPU layer runs: rows dispatched to the experts' homes (the two-phase
// path), or feplb's, whose one-hop plans send migrated rows straight to their helpers. Every plan
// is checked again by its StepLayout.
bool gpu_runnable(const Planner& planner) {
  return planner.limits().rows_via_homes || planner.name() == "feplb";
}

}  // namespace

std::unique_ptr<Planner> make_gpu_planner(const EpRuntime& runtime, std::string_view policy,
                                          const GemmCostModel* cost) {
  const RuntimeConfig& c = runtime.config();
  Knobs knobs = c.knobs;
  knobs.prefetch_window_us = prefetch_window_us(c.shape, c.max_tokens, knobs);
  PlannerContext ctx{c.topo, c.shape, knobs, cost};
  if (!cost) {
    ctx.cost_owner = std::make_shared<RooflineCostModel>(c.shape, knobs);
    ctx.cost = ctx.cost_owner.get();
  }
  std::unique_ptr<Planner> planner = make_planner(policy, ctx);
  FEPLB_REQUIRE_INPUT(gpu_runnable(*planner),
                      "layer: policy '{}' runs in simulation only (its plans keep rows at their "
                      "source or on resident "
                      "replicas; the GPU layer runs static, feplb-paper, feplb and oracle)",
                      policy);
  return planner;
}

struct MoeLayer::Impl {
  std::shared_ptr<RuntimeState> rt;
  LayerConfig cfg;
  std::unique_ptr<Planner> planner;
  int layer_id = 0;
  int64_t K = 1;
  LayoutCapacity capacity;

  // The current call (read by the scheduler's job while the caller's thread waits for it).
  std::vector<ExpertParams> experts;  // [experts_per_rank] the caller's weights
  MicroBatchState* job = nullptr;
  bool job_backward = false;
  bool job_runs = false;  // the job's plan is usable: the copies are issued and the call goes on
  bool job_dispatched = false;        // forward_dispatched: counts_host holds [R, experts_per_rank]
  const bf16* job_dy_rows = nullptr;  // backward: where the dY rows at home are
  int64_t bad_ids = 0;  // forward: (token, k) pairs of rank bad_rank with an expert id out of range
  int bad_rank = 0;
  uint32_t job_seq = 0;
  std::vector<uint8_t> recopy;  // [plan slices] backward: the helper's slot needs the weights again
  bool job_planned =
      false;  // forward: the planner planned this step (it observes it once the copies are out)
  bool job_prefetched =
      false;  // forward: the pending prefetch is this layer's, its weights are in the slots
  std::string job_error;  // forward: the plan does not match what the layer runs (every rank alike)
  std::vector<CeCopy> in_batch, out_batch, pre_batch;
  std::vector<int> pre_slot, pre_next;
  std::vector<Chunk> sends, recvs, back_sends, back_recvs;
  Clock::time_point t_counts_issued, t_plan_ready;
  bool first_copy_timed = false;  // forward: t_first_copy was recorded (scheduler thread)

  ForwardStats fstats;
  BackwardStats bstats;
  Plan last_plan;
  RoutingStep last_routing;
  Event
      ev_grads_done;  // the helpers' weight gradients of the last backward added into the caller's
  Event t_start{true}, t_dispatched{true}, t_static{true}, t_waited{true}, t_guest{true},
      t_returned{true}, t_end{true};
  Event t_counts{true}, t_first_copy{true};  // counts all-gather done; first phase-2 copy starts
  Event tb_start{true}, tb_dispatched{true}, tb_static{true}, tb_waited{true}, tb_guest{true},
      tb_results{true}, tb_end{true};
  // Timing: the guests' stream before and after each donor's wait (wait_donor()), forward and
  // backward, and how many donors the last call waited for.
  std::vector<Event> t_donor_wait, t_donor_ready, tb_donor_wait, tb_donor_ready;
  int donors_waited = 0, donors_waited_b = 0;

  void wait_seq(const std::atomic<uint32_t>& seq, uint32_t target, const char* what) const;
  void validate_experts(std::span<const ExpertParams> w, int64_t num_tokens, const char* who) const;
  void start_job(MicroBatchState& h, bool backward, std::span<const ExpertParams> w, uint32_t seq,
                 bool dispatched = false, const bf16* dy_rows = nullptr);
  // A call's sequence number, and whether a prefetch was pending when it started (it settles it).
  struct CallStart {
    uint32_t seq = 0;
    bool settle = false;
  };
  void validate_grads(std::span<const ExpertGrads> grads, const char* who) const;
  MicroBatchState& begin_forward(MicroBatch& handle, int64_t rows, bool dispatched, cudaStream_t s,
                                 CallStart& c);
  void stop_forward(CallStart c, cudaStream_t s);
  void carve_plan(MicroBatchState& h, int64_t home_rows, bool own_x_home, cudaStream_t s);
  void mark_dispatched(uint32_t seq, cudaStream_t s);
  void home_forward(const MicroBatchState& h, std::span<const ExpertParams> w, bf16* out_base,
                    cudaStream_t s);
  void end_forward(MicroBatch& handle, const MicroBatchState& h, CallStart c, cudaStream_t s);
  CallStart begin_backward(const MicroBatchState& h, std::span<const ExpertGrads> grads,
                           GradMode mode, cudaStream_t s);
  void home_backward(const MicroBatchState& h, std::span<const ExpertParams> w,
                     std::span<const ExpertGrads> grads, const bf16* dy_base, bf16* dx_base,
                     cudaStream_t s);
  void end_backward(MicroBatch& mb, CallStart c, int64_t result_copies, cudaStream_t s);
  void guests_forward(MicroBatchState& h, const bf16* guest_x, uint32_t seq, bool settled,
                      cudaStream_t s);
  int64_t guests_backward(MicroBatchState& h, uint32_t seq, bool settled, cudaStream_t s);
  void wait_rows_back(const MicroBatchState& h, uint32_t seq, cudaStream_t s);
  void add_staged_grads(const MicroBatchState& h, std::span<const ExpertGrads> grads, uint32_t seq);
  void copy_exported_results(const MicroBatchState& h, bf16* rows, uint32_t seq, cudaStream_t s);
  static void run_job(void* self);
  void plan_job();
  void issue_inputs(bool backward);
  void phase1(const MicroBatchState& h, bf16* recv_base, bf16* guest_base, uint32_t seq,
              cudaStream_t s);
  int64_t send_rows_back(cudaStream_t co, uint32_t seq);
  void reverse_exchange(const MicroBatchState& h, bf16* send_base, cudaStream_t s);
  void finish_call(uint32_t seq, cudaStream_t s, bool settled = false);
  void wait_prefetch_landed(cudaStream_t s);
  void wait_donor(int owner, uint32_t seq, int index, std::vector<Event>& before,
                  std::vector<Event>& after, cudaStream_t s);
  float donor_waits_ms(const std::vector<Event>& before, const std::vector<Event>& after,
                       int count) const;
  void slots_quiet(const StepLayout* layout, bool settled, cudaStream_t s);
};

void MoeLayer::Impl::wait_seq(const std::atomic<uint32_t>& seq, uint32_t target,
                              const char* what) const {
  const auto deadline = Clock::now() + std::chrono::duration<double>(rt->cfg.timeout_s);
  for (uint64_t spins = 0; seq.load(std::memory_order_acquire) < target; ++spins) {
    if (rt->failed.load(std::memory_order_acquire)) std::rethrow_exception(rt->error);
    if ((spins & 16383) == 16383) rt->check_peers(what);
    if ((spins & 1023) == 0 && Clock::now() > deadline) {
      throw Error(fmt::format("layer '{}' rank {}: waited {:.0f} s for the scheduler ({})",
                              cfg.name, rt->rank, rt->cfg.timeout_s, what));
    }
    spin_pause(spins);
  }
}

void MoeLayer::Impl::validate_experts(std::span<const ExpertParams> w, int64_t num_tokens,
                                      const char* who) const {
  FEPLB_REQUIRE_INPUT(static_cast<int>(w.size()) == rt->experts_per_rank,
                      "{} of layer '{}': weights of {} experts, this rank has {}", who, cfg.name,
                      w.size(), rt->experts_per_rank);
  for (size_t i = 0; i < w.size(); ++i) {
    FEPLB_REQUIRE_INPUT(w[i].gate_up && w[i].down,
                        "{} of layer '{}': local expert {} has a null weight pointer", who,
                        cfg.name, i);
  }
  FEPLB_REQUIRE_INPUT(num_tokens >= 0 && num_tokens <= rt->cfg.max_tokens,
                      "{} of layer '{}': {} tokens, the runtime's max_tokens is {}", who, cfg.name,
                      num_tokens, rt->cfg.max_tokens);
}

void MoeLayer::Impl::validate_grads(std::span<const ExpertGrads> grads, const char* who) const {
  FEPLB_REQUIRE_INPUT(static_cast<int>(grads.size()) == rt->experts_per_rank,
                      "{} of layer '{}': gradients of {} experts, this rank has {}", who, cfg.name,
                      grads.size(), rt->experts_per_rank);
  for (size_t i = 0; i < grads.size(); ++i) {
    FEPLB_REQUIRE_INPUT(grads[i].gate_up && grads[i].down,
                        "{} of layer '{}': local expert {} has a null gradient pointer", who,
                        cfg.name, i);
  }
}

// ---------------------------------------------------------------------------------------------
// The scheduler thread: counts on the host -> plan -> layout -> phase-2 input copies (forward);
// phase-2 input copies only (backward: the forward's plan).

void MoeLayer::Impl::start_job(MicroBatchState& h, bool backward, std::span<const ExpertParams> w,
                               uint32_t seq, bool dispatched, const bf16* dy_rows) {
  experts.assign(w.begin(), w.end());
  job = &h;
  job_backward = backward;
  job_dispatched = dispatched;
  job_dy_rows = dy_rows ? dy_rows : rt->dyrecv.get();
  job_runs = backward;  // a forward's job decides once it has the plan
  job_planned = false;
  if (!backward) first_copy_timed = false;
  job_error.clear();
  job_seq = seq;
  rt->scheduler.post(&Impl::run_job, this);
}

void MoeLayer::Impl::run_job(void* self) {
  auto* m = static_cast<Impl*>(self);
  try {
    if (!m->job_backward) m->plan_job();
    m->issue_inputs(m->job_backward);
  } catch (...) {
    m->rt->error = std::current_exception();
    m->rt->failed.store(true, std::memory_order_release);
  }
}

void MoeLayer::Impl::plan_job() {
  RuntimeState& r = *rt;
  MicroBatchState& h = *job;
  // Every rank's counts: wait for the D2H copy (polling: this thread exists to react at once).
  const auto deadline = Clock::now() + std::chrono::duration<double>(r.cfg.timeout_s);
  for (uint64_t spins = 0;; ++spins) {
    const cudaError_t q = cudaEventQuery(r.ev_counts.get());
    if (q == cudaSuccess) break;
    if (q != cudaErrorNotReady) FEPLB_CUDA_CHECK(q);
    if ((spins & 16383) == 16383) r.check_peers("the counts all-gather");
    if ((spins & 1023) == 0 && Clock::now() > deadline) {
      throw Error(fmt::format(
          "layer '{}' rank {}: counts never reached the host in {:.0f} s (a peer never joined the "
          "all-gather?)",
          cfg.name, r.rank, r.cfg.timeout_s));
    }
    spin_pause(spins);
  }
  const auto t_seen = Clock::now();
  const int R = r.world;
  const int E = static_cast<int>(r.E);
  if (h.routing.num_ranks != R || h.routing.num_experts != E) h.routing = RoutingStep(0, 0, R, E);
  h.routing.step = static_cast<int>(job_seq);
  h.routing.layer = layer_id;
  bad_ids = 0;
  if (job_dispatched) {
    // Each rank's rows per local expert; planners need every expert's total (at its home).
    std::fill(h.routing.counts.begin(), h.routing.counts.end(), 0);
    const int L = r.experts_per_rank;
    for (int d = 0; d < R; ++d) {
      const auto local = r.cfg.topo.local_experts(d);
      for (int i = 0; i < L; ++i) h.routing.at(d, local[i]) = r.counts_host.get()[d * L + i];
    }
  }
  for (int d = 0; d < R && !job_dispatched; ++d) {
    const int32_t* row = r.counts_host.get() + static_cast<size_t>(d) * (E + 1);
    std::copy(row, row + E, h.routing.counts.begin() + static_cast<std::ptrdiff_t>(d) * E);
    if (row[E] > 0 && bad_ids == 0) {
      bad_ids = row[E];
      bad_rank = d;
    }
  }
  if (bad_ids > 0) {
    // Every rank sees the same counts and stops at the same step; nothing is planned or copied.
    job_runs = false;
    r.plan_seq.store(job_seq, std::memory_order_release);
    return;
  }
  h.routing.sum_experts();
  const auto t0 = Clock::now();
  planner->plan(h.routing, h.plan);
  const auto t1 = Clock::now();
  job_planned = true;  // observed after the copies are issued (with prefetch, observe plans again)
  h.layout.build(r.cfg.topo, h.routing, h.plan, r.rank, capacity);
  // Weights prefetched for this forward: the plan must list exactly what was copied, in order (the
  // layout then gives each pair the slot it was copied into).
  job_error.clear();
  int64_t hits = 0;
  if (job_prefetched) {
    const std::vector<Copy>& done = r.pending.copies;
    size_t k = 0;
    bool same = true;
    for (const Copy& c : h.plan.copies) {
      if (c.kind != CopyKind::kPrefetchWeights) continue;
      same = same && k < done.size() && done[k].expert == c.expert && done[k].dst_gpu == c.dst_gpu;
      ++k;
    }
    if (!same || k != done.size()) {
      job_error = fmt::format(
          "planner '{}' of layer '{}' planned other prefetched weights than its prefetch() "
          "predicted ({} copied, {} in the plan)",
          planner->name(), cfg.name, done.size(), k);
    }
    for (const Copy& c : done) {
      for (const Slice& sl : h.plan.slices)
        hits += sl.expert == c.expert && sl.gpu == c.dst_gpu ? 1 : 0;
    }
  }
  job_runs = h.layout.fits() && job_error.empty();
  t_plan_ready = Clock::now();
  if (job_runs) {
    for (const SlotUse& u : h.layout.slot_uses()) {
      r.pool->holder(u.rank, u.slot) = ExpertSlotPool::tag(layer_id, u.expert, job_seq);
    }
  }
  h.stats = ForwardStats{};
  h.stats.counts_to_host_us = us_between(t_counts_issued, t_seen);
  h.stats.plan_us = us_between(t0, t1);
  h.stats.counts_to_plan_us = us_between(t_seen, t_plan_ready);
  h.stats.exported_rows = h.layout.exported_rows();
  h.stats.guest_rows = h.layout.guest_rows_here();
  for (const GuestWork& g : h.layout.guest_work())
    h.stats.dispatched_rows += g.dispatched ? g.rows : 0;
  h.stats.prefetched_pairs = job_prefetched ? static_cast<int64_t>(r.pending.copies.size()) : 0;
  h.stats.prefetch_hits = hits;
  r.plan_seq.store(job_seq, std::memory_order_release);
}

// Phase-2 inputs, helper by helper (each helper's signal goes up as soon as its own copies are
// issued, also when there are none: weights prefetched, rows in one hop): the weights (forward,
// unless prefetched for it; backward only where the slot was refilled) and the kHome slices' rows
// (forward: X from the micro-batch's rows at home; backward: dY from the runtime's dY buffer).
// Then, forward, the planner observes the step (off the critical path).
void MoeLayer::Impl::issue_inputs(bool backward) {
  RuntimeState& r = *rt;
  MicroBatchState& h = *job;
  const uint32_t seq = job_seq;
  const cudaStream_t cs = r.copy_in.get();
  if (job_runs) {
    const auto exports = h.layout.exports();
    bool rows = backward;
    for (const Export& x : exports) rows = rows || !x.dispatched;
    if (rows) {
      // Phase-1 rows must have landed before they are copied on: wait (on the GPU) for the event
      // the caller's stream records after the all-to-all; on the host, for it to be recorded.
      wait_seq(r.dispatched_seq, seq, "phase-1 dispatch");
      FEPLB_CUDA_CHECK(cudaStreamWaitEvent(cs, r.ev_dispatched.get(), 0));
    } else {
      // Weights only (rows in one hop): after the counts all-gather (the host saw it complete),
      // which every rank's previous call preceded, so the helpers' slots are free: the copies
      // overlap phase 1.
      FEPLB_CUDA_CHECK(cudaStreamWaitEvent(cs, r.ev_counts.get(), 0));
    }
    const int64_t H = r.H, F = r.F;
    const size_t row_bytes = static_cast<size_t>(H) * sizeof(bf16);
    const bf16* rows_base = backward ? job_dy_rows : h.x_home;
    int64_t issued = 0, weights = 0;
    for (size_t i = 0; i < exports.size();) {
      const int helper = exports[i].helper;
      in_batch.clear();
      for (; i < exports.size() && exports[i].helper == helper; ++i) {
        const Export& x = exports[i];
        if (backward ? recopy[static_cast<size_t>(x.slice)] != 0
                     : !(x.prefetched && job_prefetched)) {
          bf16* slot = r.pool->peer_slot(helper, x.slot);
          in_batch.push_back({slot, experts[static_cast<size_t>(x.local_index)].gate_up,
                              static_cast<size_t>(2 * H * F) * sizeof(bf16)});
          in_batch.push_back({slot + 2 * H * F, experts[static_cast<size_t>(x.local_index)].down,
                              static_cast<size_t>(H * F) * sizeof(bf16)});
          ++weights;
        }
        if (x.dispatched) continue;
        in_batch.push_back({r.peer_guest_in[static_cast<size_t>(helper)] + x.dst_row * H,
                            rows_base + x.src_row * H, static_cast<size_t>(x.rows) * row_bytes});
      }
      if (!backward && issued == 0) {
        const auto now = Clock::now();
        h.stats.counts_to_first_copy_us = us_between(t_counts_issued, now);
        h.stats.plan_to_first_copy_us = us_between(t_plan_ready, now);
        if (r.cfg.timing) {
          t_first_copy.record(cs);
          first_copy_timed = true;
        }
      }
      ce_copy_and_signal(cs, in_batch, nullptr, 0);
      r.signals->signal(helper, r.rank, seq, cs);
      issued += static_cast<int64_t>(in_batch.size());
    }
    (backward ? bstats.copies : h.stats.copies) += issued;
    if (!backward) h.stats.weight_copies = weights;
  }
  if (job_planned) {
    planner->observe(h.routing);
    job_planned = false;
  }
  r.ev_copy_in_done.record(cs);
  r.copies_seq.store(seq, std::memory_order_release);
}

// ---------------------------------------------------------------------------------------------
// Pieces of the caller's thread.

// Phase 1 over this step's chunks (the runtime's send buffer -> `recv_base` at the experts' homes,
// `guest_base` for rows sent straight to this rank as a helper), then the event the copy stream
// waits for.
void MoeLayer::Impl::phase1(const MicroBatchState& h, bf16* recv_base, bf16* guest_base,
                            uint32_t seq, cudaStream_t s) {
  RuntimeState& r = *rt;
  const size_t row_bytes = static_cast<size_t>(r.H) * sizeof(bf16);
  sends.clear();
  recvs.clear();
  for (const RowChunk& c : h.layout.sends()) {
    sends.push_back({c.peer, r.send.get() + c.row * r.H, static_cast<size_t>(c.rows) * row_bytes});
  }
  for (const RowChunk& c : h.layout.recvs()) {
    recvs.push_back({c.peer, (c.guest ? guest_base : recv_base) + c.row * r.H,
                     static_cast<size_t>(c.rows) * row_bytes});
  }
  r.transport.exchange(sends, recvs, s);
  mark_dispatched(seq, s);
}

// The rows at home are in place (phase 1 posted, or the caller's dispatched rows): the copy
// stream may move them on once `s` reaches here.
void MoeLayer::Impl::mark_dispatched(uint32_t seq, cudaStream_t s) {
  rt->ev_dispatched.record(s);
  rt->dispatched_seq.store(seq, std::memory_order_release);
}

// Results of this rank's kHome guest slices back into their owners' yrecv rows (forward: outputs;
// backward: dX), owner by owner, each batch ended by signal R + rank. Dispatched (one-hop) slices'
// results go back in the reverse all-to-all-v instead. Returns the copies issued.
int64_t MoeLayer::Impl::send_rows_back(cudaStream_t co, uint32_t seq) {
  RuntimeState& r = *rt;
  const size_t row_bytes = static_cast<size_t>(r.H) * sizeof(bf16);
  const auto guests = job->layout.guest_work();
  int64_t copies = 0;
  for (size_t i = 0; i < guests.size();) {
    const int owner = guests[i].owner;
    out_batch.clear();
    for (; i < guests.size() && guests[i].owner == owner; ++i) {
      const GuestWork& g = guests[i];
      if (g.dispatched) continue;
      out_batch.push_back({r.peer_yrecv[static_cast<size_t>(owner)] + g.owner_row * r.H,
                           r.guest_out.get() + g.row * r.H,
                           static_cast<size_t>(g.rows) * row_bytes});
    }
    if (!job->layout.rows_copied_from(owner)) continue;
    ce_copy_and_signal(co, out_batch, nullptr, 0);
    r.signals->signal(owner, r.world + r.rank, seq, co);
    copies += static_cast<int64_t>(out_batch.size());
  }
  return copies;
}

// The reverse all-to-all-v, the mirror of phase 1: yrecv rows (laid out like the phase-1
// receives at home) and the one-hop guests' guest_out rows back to the tokens' ranks, into
// `send_base` in send order.
void MoeLayer::Impl::reverse_exchange(const MicroBatchState& h, bf16* send_base, cudaStream_t s) {
  RuntimeState& r = *rt;
  const size_t row_bytes = static_cast<size_t>(r.H) * sizeof(bf16);
  back_sends.clear();
  back_recvs.clear();
  for (const RowChunk& c : h.layout.recvs()) {
    back_sends.push_back({c.peer, (c.guest ? r.guest_out.get() : r.yrecv.get()) + c.row * r.H,
                          static_cast<size_t>(c.rows) * row_bytes});
  }
  for (const RowChunk& c : h.layout.sends()) {
    back_recvs.push_back(
        {c.peer, send_base + c.row * r.H, static_cast<size_t>(c.rows) * row_bytes});
  }
  r.transport.exchange(back_sends, back_recvs, s);
}

// Buffers the copy streams read or write are reused by the next call: order them before it. A
// call that `settled` the pending prefetch also orders this rank's prefetch copies (they read the
// caller's weights) before later work, and clears it.
void MoeLayer::Impl::finish_call(uint32_t seq, cudaStream_t s, bool settled) {
  RuntimeState& r = *rt;
  wait_seq(r.copies_seq, seq, "phase-2 copies");
  FEPLB_CUDA_CHECK(cudaStreamWaitEvent(s, r.ev_copy_in_done.get(), 0));
  FEPLB_CUDA_CHECK(cudaStreamWaitEvent(s, r.ev_copy_out_done.get(), 0));
  if (settled) {
    FEPLB_CUDA_CHECK(cudaStreamWaitEvent(s, r.ev_prefetch_done.get(), 0));
    r.pending.active = false;
  }
}

// Later work on `s` waits for the pending prefetch's copies into this rank's guest slots, owner
// by owner (the host first waits, bounded, for each owner to have issued them).
void MoeLayer::Impl::wait_prefetch_landed(cudaStream_t s) {
  RuntimeState& r = *rt;
  for (int d = 0; d < r.world; ++d) {
    if (r.pending.into_here[static_cast<size_t>(d)])
      r.signals->wait(4 * r.world + d, r.pending.seq, s);
  }
}

// The call is done with the guest slots of the ranks it touched: those that ran guests
// (`layout`, null when the call ran none) and, when it `settled` the pending prefetch, those the
// prefetch wrote into (their stream waited for the copies). Every rank counts it for every rank
// (the same numbers everywhere); a touched rank tells each peer on `s` (signal 3R + rank), after
// the work that used its slots: a later prefetch into them waits for that.
void MoeLayer::Impl::slots_quiet(const StepLayout* layout, bool settled, cudaStream_t s) {
  RuntimeState& r = *rt;
  const int R = r.world;
  for (int g = 0; g < R; ++g) {
    const bool used = (layout && layout->guest_experts(g) > 0) || (settled && r.pending.targets[g]);
    if (!used) continue;
    const uint32_t v = ++r.slot_quiet[static_cast<size_t>(g)];
    if (g != r.rank) continue;
    for (int p = 0; p < R; ++p) {
      if (p != r.rank) r.signals->signal(p, 3 * R + r.rank, v, s);
    }
  }
}

// The start of a forward (forward(), forward_dispatched()): a micro-batch slot for `handle` (from
// here on, an exception gives its memory back) holding `rows` rows, the call's sequence number,
// `s` after the runtime's previous call. A pending prefetch is settled here (`c.settle`): this
// layer's forward uses its weights (the guests wait for them); any other layer's drops it, waiting
// for its copies into this rank before the counts all-gather, the collective that orders this
// call's copies into peers' slots after them.
MicroBatchState& MoeLayer::Impl::begin_forward(MicroBatch& handle, int64_t rows, bool dispatched,
                                               cudaStream_t s, CallStart& c) {
  RuntimeState& r = *rt;
  handle.rt_ = rt;
  handle.slot_ = r.acquire(layer_id);
  MicroBatchState& h = r.handles[static_cast<size_t>(handle.slot_)];
  handle.generation_ = h.generation;  // from here on, an exception gives the memory back
  c.seq = ++r.seq;
  h.forward_seq = c.seq;
  h.num_tokens = rows;
  h.dispatched = dispatched;
  h.stream = s;
  FEPLB_CUDA_CHECK(cudaStreamWaitEvent(s, r.ev_call_done.get(), 0));
  if (r.cfg.timing) t_start.record(s);
  c.settle = r.pending.active;
  job_prefetched = c.settle && r.pending.layer_id == layer_id;
  if (c.settle && !job_prefetched) wait_prefetch_landed(s);
  return h;
}

// A forward that stops once planned: every rank stops at the same step (they see the same counts
// and plan); the scheduler issued nothing for it, so the runtime stays usable.
void MoeLayer::Impl::stop_forward(CallStart c, cudaStream_t s) {
  if (job_prefetched) wait_prefetch_landed(s);
  slots_quiet(nullptr, c.settle, s);
  finish_call(c.seq, s, c.settle);
  rt->ev_call_done.record(s);
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

// Own experts' forward: static ones first, then the dynamic ones' rows that stay home; outputs into
// `out_base` at the rows' positions.
void MoeLayer::Impl::home_forward(const MicroBatchState& h, std::span<const ExpertParams> w,
                                  bf16* out_base, cudaStream_t s) {
  RuntimeState& r = *rt;
  const int64_t H = r.H, F = r.F;
  for (const HomeWork& hw : h.layout.home_work()) {
    const ExpertParams& p = w[static_cast<size_t>(hw.local_index)];
    expert_ffn(r.gemm, s, h.x_home + hw.row * H, hw.rows, p.gate_up, p.down,
               h.gu_home + hw.row * 2 * F, h.act_home + hw.row * F, out_base + hw.row * H, H, F);
  }
}

// The end of a forward: the copy streams' buffers ordered before the next call, the layer's last
// statistics, plan and routing; a forward-only runtime keeps nothing in `handle`.
void MoeLayer::Impl::end_forward(MicroBatch& handle, const MicroBatchState& h, CallStart c,
                                 cudaStream_t s) {
  RuntimeState& r = *rt;
  finish_call(c.seq, s, c.settle);
  if (r.cfg.timing) t_end.record(s);
  r.ev_call_done.record(s);
  fstats = h.stats;
  last_plan = h.plan;
  last_routing = h.routing;
  r.gemm.refine(kGemmRefineBudgetMs);
  if (!r.cfg.training) handle.release();  // forward only: nothing to keep
}

// The start of a backward (backward(), backward_dispatched()) of micro-batch `h`: the call's
// sequence number, `s` after the runtime's previous call, the caller's gradient ready for this
// backward's dW, and the guest weights to copy again.
MoeLayer::Impl::CallStart MoeLayer::Impl::begin_backward(const MicroBatchState& h,
                                                         std::span<const ExpertGrads> grads,
                                                         GradMode mode, cudaStream_t s) {
  RuntimeState& r = *rt;
  const int64_t H = r.H, F = r.F;
  CallStart c;
  c.seq = ++r.seq;
  bstats = BackwardStats{};
  FEPLB_CUDA_CHECK(cudaStreamWaitEvent(s, r.ev_call_done.get(), 0));
  if (r.cfg.timing) tb_start.record(s);
  // A pending prefetch is dropped: wait for its copies into this rank before the one-int
  // all-gather each backward posts, which orders this call's copies into peers' slots after them.
  c.settle = r.pending.active;
  if (c.settle) wait_prefetch_landed(s);
  // The helpers write this rank's staging slots after this backward's dispatch, and the gradient
  // gets this backward's own dW: the previous backward's adds must be done.
  FEPLB_CUDA_CHECK(cudaStreamWaitEvent(s, r.pool->staging_free(), 0));
  FEPLB_CUDA_CHECK(cudaStreamWaitEvent(s, ev_grads_done.get(), 0));
  if (mode == GradMode::kOverwrite) {
    for (const ExpertGrads& g : grads) {
      FEPLB_CUDA_CHECK(
          cudaMemsetAsync(g.gate_up, 0, static_cast<size_t>(2 * H * F) * sizeof(float), s));
      FEPLB_CUDA_CHECK(cudaMemsetAsync(g.down, 0, static_cast<size_t>(H * F) * sizeof(float), s));
    }
  }
  // Guest weights to copy again: slots another call has filled since this micro-batch's forward
  // (the same bookkeeping on every rank).
  recopy.assign(h.plan.slices.size(), 0);
  for (const SlotUse& u : h.layout.slot_uses()) {
    uint64_t& held = r.pool->holder(u.rank, u.slot);
    const uint64_t want = ExpertSlotPool::tag(layer_id, u.expert, h.forward_seq);
    recopy[static_cast<size_t>(u.slice)] = held != want;
    if (held != want && r.cfg.topo.home(u.expert) == r.rank) ++bstats.weight_recopies;
    held = want;
  }
  return c;
}

// Own experts' backward, static first: dY from `dy_base`, dX into `dx_base` (at the rows'
// positions), dW into the caller's gradient.
void MoeLayer::Impl::home_backward(const MicroBatchState& h, std::span<const ExpertParams> w,
                                   std::span<const ExpertGrads> grads, const bf16* dy_base,
                                   bf16* dx_base, cudaStream_t s) {
  RuntimeState& r = *rt;
  const int64_t H = r.H, F = r.F;
  for (const HomeWork& hw : h.layout.home_work()) {
    const ExpertParams& p = w[static_cast<size_t>(hw.local_index)];
    const ExpertGrads& g = grads[static_cast<size_t>(hw.local_index)];
    bf16* gu = h.gu_home + hw.row * 2 * F;
    bf16* act = h.act_home + hw.row * F;
    expert_ffn_backward(r.gemm, s, h.x_home + hw.row * H, hw.rows, p.gate_up, p.down, gu, act,
                        dy_base + hw.row * H, g.gate_up, g.down, 1.0f, dx_base + hw.row * H, gu,
                        act, H, F);
  }
}

// The end of a backward: the copy streams' buffers ordered before the next call, then the
// micro-batch's saved activations given back (after this backward's work on `s`).
void MoeLayer::Impl::end_backward(MicroBatch& mb, CallStart c, int64_t result_copies,
                                  cudaStream_t s) {
  RuntimeState& r = *rt;
  finish_call(c.seq, s, c.settle);
  bstats.copies += result_copies;
  if (r.cfg.timing) tb_end.record(s);
  r.ev_call_done.record(s);
  r.release(mb.slot_, mb.generation_, s);  // the saved activations, after this backward's work
  mb.release();
  r.gemm.refine(kGemmRefineBudgetMs);
}

// My exported rows' results copied back into yrecv (kHome slices; one-hop ones come back in the
// reverse all-to-all-v): `s` waits for each helper's signal R + helper.
void MoeLayer::Impl::wait_rows_back(const MicroBatchState& h, uint32_t seq, cudaStream_t s) {
  RuntimeState& r = *rt;
  for (int hh = 0; hh < r.world; ++hh) {
    if (h.layout.rows_copied_to(hh)) r.signals->wait(r.world + hh, seq, s);
  }
}

// ---------------------------------------------------------------------------------------------

MoeLayer::MoeLayer(EpRuntime& runtime, const LayerConfig& config, std::unique_ptr<Planner> planner)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.rt = runtime.state();
  RuntimeState& r = *m.rt;
  r.check_usable("layer");
  m.cfg = config;
  FEPLB_REQUIRE_INPUT(planner != nullptr, "layer '{}': no planner", config.name);
  FEPLB_REQUIRE_INPUT(config.top_k >= 1 && config.top_k <= r.cfg.max_top_k,
                      "layer '{}': top_k {}, the runtime's max_top_k is {}", config.name,
                      config.top_k, r.cfg.max_top_k);
  const PlanLimits limits = planner->limits();
  FEPLB_REQUIRE_INPUT(
      gpu_runnable(*planner),
      "layer '{}': planner '{}' runs in simulation only (its plans keep rows at their source or on "
      "resident replicas)",
      config.name, planner->name());
  FEPLB_REQUIRE_INPUT(
      r.world == 1 || r.transport.supports_peer_copies() || limits.max_guest_experts == 0,
      "layer '{}': transport '{}' cannot copy into peers' buffers; use policy static", config.name,
      r.transport.name());
  m.planner = std::move(planner);
  m.K = config.top_k;
  m.layer_id = r.next_layer_id++;
  m.capacity.recv_rows = r.recv_cap;
  m.capacity.guest_rows = r.guest_cap;
  m.capacity.guest_slots = r.pool->slots();
  m.capacity.staging_slots = r.cfg.training ? r.pool->staging_slots() : -1;
}

MoeLayer::~MoeLayer() = default;

const LayerConfig& MoeLayer::config() const { return impl_->cfg; }
std::string_view MoeLayer::policy() const { return impl_->planner->name(); }
int MoeLayer::layer_id() const { return impl_->layer_id; }
const Plan& MoeLayer::last_plan() const { return impl_->last_plan; }
const RoutingStep& MoeLayer::last_routing() const { return impl_->last_routing; }
void MoeLayer::refine_gemm_algorithms(double budget_ms) { impl_->rt->gemm.refine(budget_ms); }

const ForwardStats& MoeLayer::last_forward_stats() const {
  Impl& m = *impl_;
  if (m.rt->cfg.timing) {
    m.fstats.forward_ms = elapsed_ms(m.t_start, m.t_end);
    m.fstats.dispatch_ms = elapsed_ms(m.t_start, m.t_dispatched);
    m.fstats.static_ms = elapsed_ms(m.t_dispatched, m.t_static);
    const float between = m.donor_waits_ms(m.t_donor_wait, m.t_donor_ready, m.donors_waited);
    m.fstats.wait_ms = elapsed_ms(m.t_static, m.t_waited) + between;
    m.fstats.guest_ms = elapsed_ms(m.t_waited, m.t_guest) - between;
    m.fstats.return_ms = elapsed_ms(m.t_guest, m.t_returned);
    m.fstats.combine_ms = elapsed_ms(m.t_returned, m.t_end);
    m.fstats.gpu_counts_to_first_copy_ms =
        m.first_copy_timed ? elapsed_ms(m.t_counts, m.t_first_copy) : 0.0f;
  }
  return m.fstats;
}

const BackwardStats& MoeLayer::last_backward_stats() const {
  Impl& m = *impl_;
  if (m.rt->cfg.timing) {
    m.bstats.backward_ms = elapsed_ms(m.tb_start, m.tb_end);
    m.bstats.dispatch_ms = elapsed_ms(m.tb_start, m.tb_dispatched);
    m.bstats.combine_ms = elapsed_ms(m.tb_results, m.tb_end);
    m.bstats.static_ms = elapsed_ms(m.tb_dispatched, m.tb_static);
    const float between = m.donor_waits_ms(m.tb_donor_wait, m.tb_donor_ready, m.donors_waited_b);
    m.bstats.wait_ms = elapsed_ms(m.tb_static, m.tb_waited) + between;
    m.bstats.guest_ms = elapsed_ms(m.tb_waited, m.tb_guest) - between;
    m.bstats.results_wait_ms = elapsed_ms(m.tb_guest, m.tb_results);
  }
  return m.bstats;
}

void MoeLayer::sync_gradients(cudaStream_t stream) {
  impl_->rt->check_usable("sync_gradients");
  FEPLB_CUDA_CHECK(cudaStreamWaitEvent(stream, impl_->ev_grads_done.get(), 0));
}

// Weights before routing. Ordering, per helper h and guest slot: the copies wait for h's "slots
// quiet" signal of the last call that used or wrote h's slots (its guests ran, or it waited for
// an earlier prefetch), so they never overwrite weights a guest GEMM still reads; h's next call
// waits for the copies (signal 4R + owner) before its guests if it uses them, or before its first
// collective if it drops them, so no later copy into the same slots can overtake them. The slot
// pool's records say which expert each slot holds from here on (backward re-copies).
void MoeLayer::prefetch(std::span<const ExpertParams> experts, cudaStream_t stream) {
  Impl& m = *impl_;
  RuntimeState& r = *m.rt;
  r.check_usable("prefetch");
  m.validate_experts(experts, 0, "prefetch");
  CallGuard guard(r, "prefetch");
  const int R = r.world;
  const std::span<const Copy> predicted = m.planner->prefetch(m.layer_id);
  prefetch_slots(predicted, R, m.pre_slot, m.pre_next);
  for (size_t i = 0; i < predicted.size(); ++i) {
    const Copy& c = predicted[i];
    const bool ok = c.kind == CopyKind::kPrefetchWeights && c.expert >= 0 && c.expert < r.E &&
                    c.dst_gpu >= 0 && c.dst_gpu < R && c.src_gpu == r.cfg.topo.home(c.expert) &&
                    c.dst_gpu != c.src_gpu && m.pre_slot[i] < r.pool->slots();
    FEPLB_REQUIRE_INPUT(
        ok,
        "prefetch of layer '{}': planner '{}' predicts a copy of expert {} from GPU {} to GPU {} "
        "the "
        "runtime cannot make (weights from the expert's home to another GPU, at most {} per GPU)",
        m.cfg.name, m.planner->name(), c.expert, c.src_gpu, c.dst_gpu, r.pool->slots());
  }
  FEPLB_CUDA_CHECK(cudaStreamWaitEvent(stream, r.ev_call_done.get(), 0));
  if (r.pending.active) {  // an earlier prefetch that no forward used: drop it
    m.wait_prefetch_landed(stream);
    m.slots_quiet(nullptr, /*settled=*/true, stream);
    FEPLB_CUDA_CHECK(cudaStreamWaitEvent(stream, r.ev_prefetch_done.get(), 0));
    r.pending.active = false;
  }
  if (predicted.empty()) {
    r.ev_call_done.record(stream);
    return;
  }
  const uint32_t seq = ++r.seq;
  PendingPrefetch& p = r.pending;
  p.active = true;
  p.layer_id = m.layer_id;
  p.seq = seq;
  p.copies.assign(predicted.begin(), predicted.end());
  p.slots.assign(m.pre_slot.begin(), m.pre_slot.end());
  std::fill(p.into_here.begin(), p.into_here.end(), uint8_t{0});
  std::fill(p.targets.begin(), p.targets.end(), uint8_t{0});
  for (size_t i = 0; i < p.copies.size(); ++i) {
    const Copy& c = p.copies[i];
    p.targets[static_cast<size_t>(c.dst_gpu)] = 1;
    if (c.dst_gpu == r.rank) p.into_here[static_cast<size_t>(c.src_gpu)] = 1;
    r.pool->holder(c.dst_gpu, p.slots[i]) = ExpertSlotPool::tag(m.layer_id, c.expert, seq);
  }
  // This rank's copies, helper by helper, after `stream`'s prior work, on the copy stream of the
  // phase-2 inputs (the next forward's copies queue behind them, as the planner's links do).
  const int64_t H = r.H, F = r.F;
  const cudaStream_t cp = r.copy_in.get();
  r.ev_prefetch_ready.record(stream);
  FEPLB_CUDA_CHECK(cudaStreamWaitEvent(cp, r.ev_prefetch_ready.get(), 0));
  for (int g = 0; g < R; ++g) {
    m.pre_batch.clear();
    for (size_t i = 0; i < p.copies.size(); ++i) {
      const Copy& c = p.copies[i];
      if (c.src_gpu != r.rank || c.dst_gpu != g) continue;
      const auto local = r.cfg.topo.local_experts(r.rank);
      const ExpertParams& w = experts[static_cast<size_t>(
          std::find(local.begin(), local.end(), c.expert) - local.begin())];
      bf16* slot = r.pool->peer_slot(g, p.slots[i]);
      m.pre_batch.push_back({slot, w.gate_up, static_cast<size_t>(2 * H * F) * sizeof(bf16)});
      m.pre_batch.push_back({slot + 2 * H * F, w.down, static_cast<size_t>(H * F) * sizeof(bf16)});
    }
    if (m.pre_batch.empty()) continue;
    const uint32_t quiet = r.slot_quiet[static_cast<size_t>(g)];
    if (quiet > 0) r.signals->wait(3 * R + g, quiet, cp);
    ce_copy_and_signal(cp, m.pre_batch, nullptr, 0);
    r.signals->signal(g, 4 * R + r.rank, seq, cp);
  }
  r.ev_prefetch_done.record(cp);
  r.ev_call_done.record(stream);
}

MicroBatch MoeLayer::forward(std::span<const ExpertParams> experts, const bf16* hidden,
                             const int32_t* topk_idx, const float* topk_weight, int64_t num_tokens,
                             bf16* out, cudaStream_t stream) {
  Impl& m = *impl_;
  RuntimeState& r = *m.rt;
  r.check_usable("forward");
  m.validate_experts(experts, num_tokens, "forward");
  FEPLB_REQUIRE_INPUT(num_tokens == 0 || (hidden && topk_idx && topk_weight && out),
                      "forward of layer '{}': a null input or output pointer with {} tokens",
                      m.cfg.name, num_tokens);
  CallGuard guard(r, "forward");
  const int64_t H = r.H, K = m.K;
  const cudaStream_t s = stream;

  MicroBatch handle;
  Impl::CallStart c;
  MicroBatchState& h = m.begin_forward(handle, num_tokens, /*dispatched=*/false, s, c);
  const uint32_t seq = c.seq;

  // Saved per token: pair positions and the outputs in send order.
  const int64_t pairs = num_tokens * K;
  const auto carve_tokens = [&](void* base) {
    Carver cv(base);
    h.pair_pos = cv.take<int32_t>(pairs);
    h.y_send = cv.take<bf16>(pairs * H);
    return cv.bytes();
  };
  h.bytes_tokens = pairs ? carve_tokens(nullptr) : 0;
  h.mem_tokens = r.allocate(h.bytes_tokens, s);
  carve_tokens(h.mem_tokens);

  // 1. Permute rows into send order and count rows per expert.
  FEPLB_CUDA_CHECK(cudaMemsetAsync(r.counts.get(), 0, r.counts.bytes(), s));
  FEPLB_CUDA_CHECK(cudaMemsetAsync(r.cursor.get(), 0, r.cursor.bytes(), s));
  FEPLB_CUDA_CHECK(
      kernels::count_experts(topk_idx, pairs, static_cast<int>(r.E), r.counts.get(), s));
  FEPLB_CUDA_CHECK(kernels::send_offsets(r.counts.get(), r.order.get(), static_cast<int>(r.E),
                                         r.offsets.get(), s));
  FEPLB_CUDA_CHECK(kernels::scatter_rows(hidden, topk_idx, num_tokens, static_cast<int>(K),
                                         static_cast<int>(r.E), H, r.offsets.get(), r.cursor.get(),
                                         r.send.get(), h.pair_pos, s));
  // 2. Every rank's counts (and its out-of-range expert ids), to every rank and to the host; the
  // scheduler plans from them.
  r.transport.all_gather_i32(r.counts.get(), r.counts_all.get(), static_cast<size_t>(r.E + 1), s);
  if (r.cfg.timing) m.t_counts.record(s);
  if (r.cfg.sync_before_counts) r.sync(s, "the counts all-gather");
  m.t_counts_issued = Clock::now();
  FEPLB_CUDA_CHECK(cudaMemcpyAsync(r.counts_host.get(), r.counts_all.get(), r.counts_all.bytes(),
                                   cudaMemcpyDeviceToHost, s));
  r.ev_counts.record(s);
  m.start_job(h, false, experts, seq);
  m.wait_seq(r.plan_seq, seq, "plan");
  if (m.bad_ids > 0) {
    m.stop_forward(c, s);
    throw InputError(fmt::format(
        "forward of layer '{}': rank {} routed {} (token, k) pairs to expert ids outside "
        "[0, {}) (topk_idx out of range)",
        m.cfg.name, m.bad_rank, m.bad_ids, r.E));
  }
  int64_t sent = 0;
  for (int e = 0; e < r.E; ++e) sent += h.routing.at(r.rank, e);
  FEPLB_CHECK(sent == pairs, "layer '{}': counted {} rows, expected tokens * top_k = {}",
              m.cfg.name, sent, pairs);
  if (!h.layout.fits()) {
    m.stop_forward(c, s);
    throw InputError(fmt::format("layer '{}': {}", m.cfg.name, h.layout.error()));
  }
  if (!m.job_error.empty()) {
    m.stop_forward(c, s);
    throw Error(m.job_error);
  }

  m.carve_plan(h, h.layout.recv_rows(r.rank), /*own_x_home=*/true, s);

  // 3. Phase 1: rows to their experts' homes, expert-major on the receiver; one-hop rows straight
  // into the guest rows kept for the backward (training) or the guest arena.
  bf16* const guest_x = h.x_guest ? h.x_guest : r.guest_in.get();
  m.phase1(h, h.x_home, guest_x, seq, s);
  if (r.cfg.timing) m.t_dispatched.record(s);

  // 4. Own experts, outputs into yrecv.
  m.home_forward(h, experts, r.yrecv.get(), s);
  if (r.cfg.timing) m.t_static.record(s);

  // 5. Guests, their outputs back to their owners by copy engine; 6. my exported rows' outputs
  // copied back (kHome slices): wait for each helper's signal.
  m.guests_forward(h, guest_x, seq, c.settle, s);
  m.wait_rows_back(h, seq, s);
  if (r.cfg.timing) m.t_returned.record(s);

  // 7. Reverse all-to-all-v (outputs back to the tokens' ranks) and the weighted combine.
  m.reverse_exchange(h, h.y_send, s);
  FEPLB_CUDA_CHECK(kernels::combine(h.y_send, h.pair_pos, topk_weight, num_tokens,
                                    static_cast<int>(K), H, out, s));

  m.end_forward(handle, h, c, s);
  return handle;
}

void MoeLayer::backward(MicroBatch&& mb, std::span<const ExpertParams> experts,
                        const bf16* grad_out, const float* topk_weight, bf16* grad_hidden,
                        float* grad_topk_weight, std::span<const ExpertGrads> grads, GradMode mode,
                        cudaStream_t stream) {
  Impl& m = *impl_;
  RuntimeState& r = *m.rt;
  r.check_usable("backward");
  FEPLB_REQUIRE_INPUT(r.cfg.training,
                      "backward of layer '{}': the runtime was built without training "
                      "(RuntimeConfig::training)",
                      m.cfg.name);
  FEPLB_REQUIRE_INPUT(!mb.rt_ || mb.rt_ == m.rt,
                      "backward of layer '{}': the micro-batch belongs to another runtime",
                      m.cfg.name);
  MicroBatchState& h = mb.checked();
  FEPLB_REQUIRE_INPUT(h.layer_id == m.layer_id,
                      "backward of layer '{}' (layer {}): the micro-batch is layer {}'s",
                      m.cfg.name, m.layer_id, h.layer_id);
  const int64_t num_tokens = h.num_tokens;
  m.validate_experts(experts, num_tokens, "backward");
  m.validate_grads(grads, "backward");
  FEPLB_REQUIRE_INPUT(
      num_tokens == 0 || (grad_out && topk_weight && grad_hidden && grad_topk_weight),
      "backward of layer '{}': a null input or output pointer with {} tokens", m.cfg.name,
      num_tokens);
  CallGuard guard(r, "backward");
  const int64_t H = r.H, K = m.K;
  const cudaStream_t s = stream;
  const Impl::CallStart c = m.begin_backward(h, grads, mode, s);
  const uint32_t seq = c.seq;
  // The scheduler issues the phase-2 inputs once phase 1 is posted.
  m.start_job(h, true, experts, seq);

  // 1. dY in send order (weighted by the router) and the router weights' gradient.
  FEPLB_CUDA_CHECK(kernels::scatter_grad(grad_out, h.pair_pos, topk_weight, h.y_send, num_tokens,
                                         static_cast<int>(K), H, r.send.get(), grad_topk_weight,
                                         s));
  // 2. Phase 1: dY rows to the experts' homes (the forward's sizes). First a one-int all-gather,
  // the collective that orders this rank's phase-2 copies into its peers' arenas after the peers'
  // last use of them (an all-to-all alone does not: zero-byte chunks are never sent).
  r.transport.all_gather_i32(r.counts.get(), r.counts_all.get(), 1, s);
  m.phase1(h, r.dyrecv.get(), r.guest_in.get(), seq, s);
  if (r.cfg.timing) m.tb_dispatched.record(s);

  // 3. Own experts' backward, static first; dX into yrecv, dW into the caller's gradient.
  m.home_backward(h, experts, grads, r.dyrecv.get(), r.yrecv.get(), s);
  if (r.cfg.timing) m.tb_static.record(s);

  // 4. Guests: dX and dW; 5. their results to their owners by copy engine.
  const int64_t result_copies = m.guests_backward(h, seq, c.settle, s);
  // 6. My exported slices: the compute stream waits for their dX (kHome slices; one-hop ones come
  // back in the reverse all-to-all-v); the copy stream for their dW, which it then adds into the
  // caller's gradient (sync_gradients and the next backward wait).
  m.wait_rows_back(h, seq, s);
  if (r.cfg.timing) m.tb_results.record(s);
  m.add_staged_grads(h, grads, seq);

  // 7. dX back to the tokens' ranks (reverse all-to-all into ybuf) and summed over each token's k
  // choices (the router weights are already in dY).
  m.reverse_exchange(h, r.ybuf.get(), s);
  FEPLB_CUDA_CHECK(kernels::combine(r.ybuf.get(), h.pair_pos, nullptr, num_tokens,
                                    static_cast<int>(K), H, grad_hidden, s));

  m.end_backward(mb, c, result_copies, s);
}

// ---------------------------------------------------------------------------------------------
// Guests and exported slices' results, for both paths (the layer's own dispatch, and rows a
// framework dispatched itself).

// Waits (no SM) on `s` for `owner`'s signal of call `seq`: its copies to this rank have landed.
// With timing, the stream is marked before and after (the `index`-th donor of the call).
void MoeLayer::Impl::wait_donor(int owner, uint32_t seq, int index, std::vector<Event>& before,
                                std::vector<Event>& after, cudaStream_t s) {
  RuntimeState& r = *rt;
  const bool timed = r.cfg.timing;
  if (timed) {
    while (before.size() <= static_cast<size_t>(index)) {
      before.emplace_back(true);
      after.emplace_back(true);
    }
    before[static_cast<size_t>(index)].record(s);
  }
  r.signals->wait(owner, seq, s);
  if (timed) after[static_cast<size_t>(index)].record(s);
}

// The time the guests' stream idled in the last call's first `count` donor waits.
float MoeLayer::Impl::donor_waits_ms(const std::vector<Event>& before,
                                     const std::vector<Event>& after, int count) const {
  float ms = 0;
  for (int i = 0; i < count; ++i)
    ms += elapsed_ms(before[static_cast<size_t>(i)], after[static_cast<size_t>(i)]);
  return ms;
}

// Guests of a forward: wait (no SM) for weights prefetched for this forward, then, owner by owner
// in the layout's order (when their copies land, modelled), wait for the owner's signal and
// compute its guests (one-hop rows from `guest_x`, where phase 1 put them; forward_dispatched has
// none, every guest's rows are copied into the guest arena): one owner's guests run while the
// next owner's copies still land. Then this rank's guest slots are quiet. On the copy stream: the
// copied guests' rows kept for the backward (training; the arena is reused by the next call;
// one-hop rows landed there already), then their outputs back to their owners' yrecv rows, owner by
// owner, each ended by a signal.
void MoeLayer::Impl::guests_forward(MicroBatchState& h, const bf16* guest_x, uint32_t seq,
                                    bool settled, cudaStream_t s) {
  RuntimeState& r = *rt;
  const int64_t H = r.H, F = r.F;
  if (job_prefetched) wait_prefetch_landed(s);
  if (r.cfg.timing) t_waited.record(s);
  bool copied_guests = false, dispatched_guests = false;
  const auto guests = h.layout.guest_work();
  donors_waited = 0;
  for (size_t i = 0; i < guests.size();) {
    const int owner = guests[i].owner;
    wait_donor(owner, seq, donors_waited++, t_donor_wait, t_donor_ready, s);
    size_t end = i;
    while (end < guests.size() && guests[end].owner == owner) ++end;
    if (end == guests.size()) r.ev_guest_ready.record(s);  // every guest's rows have landed
    for (; i < end; ++i) {
      const GuestWork& g = guests[i];
      const bf16* w = r.pool->slot(g.slot);
      const bf16* x = (g.dispatched ? guest_x : r.guest_in.get()) + g.row * H;
      expert_ffn(r.gemm, s, x, g.rows, w, w + 2 * H * F, h.gu_guest + g.row * 2 * F,
                 h.act_guest + g.row * F, r.guest_out.get() + g.row * H, H, F);
      (g.dispatched ? dispatched_guests : copied_guests) = true;
    }
  }
  if (guests.empty()) r.ev_guest_ready.record(s);
  slots_quiet(&h.layout, settled, s);
  if (r.cfg.timing) t_guest.record(s);
  r.ev_guest_done.record(s);
  const cudaStream_t co = r.copy_out.get();
  if (h.x_guest && copied_guests) {
    FEPLB_CUDA_CHECK(cudaStreamWaitEvent(co, r.ev_guest_ready.get(), 0));
    if (!dispatched_guests) {
      const int64_t guest = h.layout.guest_rows_here();
      FEPLB_CUDA_CHECK(cudaMemcpyAsync(h.x_guest, r.guest_in.get(),
                                       static_cast<size_t>(guest * H) * sizeof(bf16),
                                       cudaMemcpyDeviceToDevice, co));
    } else {
      for (const GuestWork& g : h.layout.guest_work()) {
        if (g.dispatched) continue;
        FEPLB_CUDA_CHECK(cudaMemcpyAsync(h.x_guest + g.row * H, r.guest_in.get() + g.row * H,
                                         static_cast<size_t>(g.rows * H) * sizeof(bf16),
                                         cudaMemcpyDeviceToDevice, co));
      }
    }
  }
  FEPLB_CUDA_CHECK(cudaStreamWaitEvent(co, r.ev_guest_done.get(), 0));
  send_rows_back(co, seq);
  r.ev_copy_out_done.record(co);
}

// Guests of a backward: wait for each owner's dY (and weights), dX and dW, send both back (dX
// into the owner's yrecv, signal R + rank; dW into its staging slots, signal 2R + rank). Returns
// the copies issued.
int64_t MoeLayer::Impl::guests_backward(MicroBatchState& h, uint32_t seq, bool settled,
                                        cudaStream_t s) {
  RuntimeState& r = *rt;
  const int64_t H = r.H, F = r.F;
  FEPLB_CUDA_CHECK(cudaStreamWaitEvent(s, r.pool->grads_free(), 0));
  if (r.cfg.timing) tb_waited.record(s);
  // Owner by owner, as the forward: each owner's guests once its dY rows have landed.
  const auto guests = h.layout.guest_work();
  donors_waited_b = 0;
  for (size_t i = 0; i < guests.size();) {
    const int owner = guests[i].owner;
    wait_donor(owner, seq, donors_waited_b++, tb_donor_wait, tb_donor_ready, s);
    for (; i < guests.size() && guests[i].owner == owner; ++i) {
      const GuestWork& g = guests[i];
      const bf16* w = r.pool->slot(g.slot);
      float* gw = r.pool->grad_slot(g.slot);
      bf16* gu = h.gu_guest + g.row * 2 * F;
      bf16* act = h.act_guest + g.row * F;
      expert_ffn_backward(r.gemm, s, h.x_guest + g.row * H, g.rows, w, w + 2 * H * F, gu, act,
                          r.guest_in.get() + g.row * H, gw, gw + 2 * H * F, 0.0f,
                          r.guest_out.get() + g.row * H, gu, act, H, F);
      bstats.guest_rows += g.rows;
    }
  }
  slots_quiet(&h.layout, settled, s);
  if (r.cfg.timing) tb_guest.record(s);
  r.ev_guest_done.record(s);
  const cudaStream_t co = r.copy_out.get();
  FEPLB_CUDA_CHECK(cudaStreamWaitEvent(co, r.ev_guest_done.get(), 0));
  int64_t copies = send_rows_back(co, seq);
  const int64_t w_elems = expert_weight_elems(H, F);
  for (size_t i = 0; i < guests.size();) {
    const int owner = guests[i].owner;
    out_batch.clear();
    for (; i < guests.size() && guests[i].owner == owner; ++i) {
      out_batch.push_back({r.pool->peer_staging_slot(owner, guests[i].staging_slot),
                           r.pool->grad_slot(guests[i].slot),
                           static_cast<size_t>(w_elems) * sizeof(float)});
    }
    ce_copy_and_signal(co, out_batch, nullptr, 0);
    r.signals->signal(owner, 2 * r.world + r.rank, seq, co);
    copies += static_cast<int64_t>(out_batch.size());
  }
  FEPLB_CUDA_CHECK(cudaEventRecord(r.pool->grads_free(), co));
  r.ev_copy_out_done.record(co);
  return copies;
}

// My exported slices' dW: the copy stream waits for each helper's signal and adds the staged
// gradients into the caller's (sync_gradients and the next backward wait for it).
void MoeLayer::Impl::add_staged_grads(const MicroBatchState& h, std::span<const ExpertGrads> grads,
                                      uint32_t seq) {
  RuntimeState& r = *rt;
  const int64_t H = r.H, F = r.F;
  const cudaStream_t co = r.copy_out.get();
  for (int hh = 0; hh < r.world; ++hh) {
    if (h.layout.exports_to(hh)) r.signals->wait(2 * r.world + hh, seq, co);
  }
  for (const Export& x : h.layout.exports()) {
    const float* staged = r.pool->staging_slot(x.staging_slot);
    const ExpertGrads& g = grads[static_cast<size_t>(x.local_index)];
    FEPLB_CUDA_CHECK(kernels::add_f32(g.gate_up, staged, 2 * H * F, co));
    FEPLB_CUDA_CHECK(kernels::add_f32(g.down, staged + 2 * H * F, H * F, co));
  }
  FEPLB_CUDA_CHECK(cudaEventRecord(r.pool->staging_free(), co));
  ev_grads_done.record(co);
}

// Rows my exported slices' helpers sent back into yrecv (outputs, or dX), into the caller's
// `rows` at the same positions, once each helper's signal is in.
void MoeLayer::Impl::copy_exported_results(const MicroBatchState& h, bf16* rows, uint32_t seq,
                                           cudaStream_t s) {
  RuntimeState& r = *rt;
  for (int hh = 0; hh < r.world; ++hh) {
    if (h.layout.exports_to(hh)) r.signals->wait(r.world + hh, seq, s);
  }
  for (const Export& x : h.layout.exports()) {
    FEPLB_CUDA_CHECK(cudaMemcpyAsync(rows + x.src_row * r.H, r.yrecv.get() + x.src_row * r.H,
                                     static_cast<size_t>(x.rows * r.H) * sizeof(bf16),
                                     cudaMemcpyDeviceToDevice, s));
  }
}

// ---------------------------------------------------------------------------------------------
// Rows a framework dispatched itself: phase 2 and the GEMMs only.

MicroBatch MoeLayer::forward_dispatched(std::span<const ExpertParams> experts, const bf16* rows,
                                        std::span<const int64_t> rows_per_expert, bf16* out_rows,
                                        cudaStream_t stream) {
  Impl& m = *impl_;
  RuntimeState& r = *m.rt;
  r.check_usable("forward_dispatched");
  FEPLB_REQUIRE_INPUT(static_cast<int>(rows_per_expert.size()) == r.experts_per_rank,
                      "forward_dispatched of layer '{}': rows of {} experts, this rank has {}",
                      m.cfg.name, rows_per_expert.size(), r.experts_per_rank);
  int64_t n = 0;
  for (size_t i = 0; i < rows_per_expert.size(); ++i) {
    FEPLB_REQUIRE_INPUT(rows_per_expert[i] >= 0 && rows_per_expert[i] <= (int64_t{1} << 30),
                        "forward_dispatched of layer '{}': local expert {} has {} rows", m.cfg.name,
                        i, rows_per_expert[i]);
    n += rows_per_expert[i];
  }
  FEPLB_REQUIRE_INPUT(n <= r.recv_cap,
                      "forward_dispatched of layer '{}': {} rows, over the runtime's receive "
                      "capacity {} (recv_capacity_rows)",
                      m.cfg.name, n, r.recv_cap);
  m.validate_experts(experts, 0, "forward_dispatched");
  FEPLB_REQUIRE_INPUT(n == 0 || (rows && out_rows),
                      "forward_dispatched of layer '{}': a null row pointer with {} "
                      "rows",
                      m.cfg.name, n);
  FEPLB_REQUIRE_INPUT(
      m.planner->limits().rows_via_homes,
      "forward_dispatched of layer '{}': planner '{}' plans rows in one hop (one_hop = 1), which "
      "needs the layer's own dispatch (forward())",
      m.cfg.name, m.planner->name());
  CallGuard guard(r, "forward_dispatched");
  const int L = r.experts_per_rank;
  const cudaStream_t s = stream;
  MicroBatch handle;
  Impl::CallStart c;
  // A pending prefetch is settled as in forward(): used by this layer, dropped by another.
  MicroBatchState& h = m.begin_forward(handle, n, /*dispatched=*/true, s, c);
  const uint32_t seq = c.seq;
  // Every rank's rows per local expert, to every rank and to the host (the pinned buffer's
  // first L entries stage this rank's; the previous call's D2H into it is done).
  for (int i = 0; i < L; ++i)
    r.counts_host.get()[i] = static_cast<int32_t>(rows_per_expert[static_cast<size_t>(i)]);
  FEPLB_CUDA_CHECK(cudaMemcpyAsync(r.counts.get(), r.counts_host.get(),
                                   static_cast<size_t>(L) * sizeof(int32_t), cudaMemcpyHostToDevice,
                                   s));
  r.transport.all_gather_i32(r.counts.get(), r.counts_all.get(), static_cast<size_t>(L), s);
  if (r.cfg.timing) m.t_counts.record(s);
  m.t_counts_issued = Clock::now();
  FEPLB_CUDA_CHECK(cudaMemcpyAsync(r.counts_host.get(), r.counts_all.get(),
                                   static_cast<size_t>(r.world * L) * sizeof(int32_t),
                                   cudaMemcpyDeviceToHost, s));
  r.ev_counts.record(s);
  m.start_job(h, false, experts, seq, /*dispatched=*/true);
  m.wait_seq(r.plan_seq, seq, "plan");
  if (!h.layout.fits() || !m.job_error.empty()) {
    m.stop_forward(c, s);
    if (!m.job_error.empty()) throw Error(m.job_error);
    throw InputError(fmt::format("layer '{}': {}", m.cfg.name, h.layout.error()));
  }
  m.carve_plan(h, n, /*own_x_home=*/false, s);
  h.x_home = const_cast<bf16*>(rows);  // the caller's, read only
  // The rows are in place: the copy stream may move them on from here.
  m.mark_dispatched(seq, s);
  if (r.cfg.timing) m.t_dispatched.record(s);
  m.home_forward(h, experts, out_rows, s);
  if (r.cfg.timing) m.t_static.record(s);
  m.guests_forward(h, r.guest_in.get(), seq, c.settle, s);
  m.copy_exported_results(h, out_rows, seq, s);
  if (r.cfg.timing) m.t_returned.record(s);
  m.end_forward(handle, h, c, s);
  return handle;
}

void MoeLayer::backward_dispatched(MicroBatch&& mb, std::span<const ExpertParams> experts,
                                   const bf16* grad_out_rows, bf16* grad_rows,
                                   std::span<const ExpertGrads> grads, GradMode mode,
                                   cudaStream_t stream) {
  Impl& m = *impl_;
  RuntimeState& r = *m.rt;
  r.check_usable("backward_dispatched");
  FEPLB_REQUIRE_INPUT(r.cfg.training,
                      "backward_dispatched of layer '{}': the runtime was built without training",
                      m.cfg.name);
  FEPLB_REQUIRE_INPUT(!mb.rt_ || mb.rt_ == m.rt,
                      "backward_dispatched of layer '{}': the micro-batch belongs to "
                      "another runtime",
                      m.cfg.name);
  MicroBatchState& h = mb.checked();
  FEPLB_REQUIRE_INPUT(
      h.layer_id == m.layer_id && h.dispatched,
      "backward_dispatched of layer '{}' (layer {}): the micro-batch is layer {}'s{}", m.cfg.name,
      m.layer_id, h.layer_id, h.dispatched ? "" : ", from forward() (use backward())");
  const int64_t n = h.num_tokens;
  m.validate_experts(experts, 0, "backward_dispatched");
  m.validate_grads(grads, "backward_dispatched");
  FEPLB_REQUIRE_INPUT(n == 0 || (grad_out_rows && grad_rows),
                      "backward_dispatched of layer '{}': a null row pointer with {} rows",
                      m.cfg.name, n);
  CallGuard guard(r, "backward_dispatched");
  const cudaStream_t s = stream;
  // A pending prefetch is dropped, as in backward().
  const Impl::CallStart c = m.begin_backward(h, grads, mode, s);
  const uint32_t seq = c.seq;
  m.start_job(h, true, experts, seq, /*dispatched=*/true, grad_out_rows);
  // The collective that orders this rank's copies into its peers' arenas after their last use.
  r.transport.all_gather_i32(r.counts.get(), r.counts_all.get(), 1, s);
  m.mark_dispatched(seq, s);
  if (r.cfg.timing) m.tb_dispatched.record(s);
  m.home_backward(h, experts, grads, grad_out_rows, grad_rows, s);
  if (r.cfg.timing) m.tb_static.record(s);
  const int64_t result_copies = m.guests_backward(h, seq, c.settle, s);
  m.copy_exported_results(h, grad_rows, seq, s);
  if (r.cfg.timing) m.tb_results.record(s);
  m.add_staged_grads(h, grads, seq);
  m.end_backward(mb, c, result_copies, s);
}

}  // namespace feplb::cuda
