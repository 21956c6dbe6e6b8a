// MoeLayer's private state: configuration, planner, the programs it builds per call and the two
// executors that run them (one per host thread), its timelines and last statistics, and the
// scheduler's job of the current call. Internal to feplb_cuda.
//
// The scheduler hand-off, per call (numbered by the signal board):
//   caller:    fills `job` (and `experts`), then posts the job (HostAction::kStartJob);
//   scheduler: forward: plans into the micro-batch state (routing, plan, layout, stats) and
//              `job.runs` / `job.bad_ids` / `job.error`, then publishes HostFlag::kPlanned; the
//              caller reads them only after awaiting it;
//   both:      the caller publishes HostFlag::kDispatched after phase 1 (the scheduler's inputs
//              wait for it when they copy rows); the scheduler publishes HostFlag::kCopiesOut as
//              its last step (the stats it counted, bstats.copies included, are final then);
//              the caller awaits it before the call ends. Nothing of the job is written after.
#pragma once

#include <chrono>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "feplb/core/planners/planner.h"
#include "feplb/core/planners/planner_clock.h"
#include "feplb/cuda/host/step_layout.h"
#include "feplb/cuda/moe_layer.h"
#include "feplb/cuda/program/build_program.h"
#include "feplb/cuda/program/executor.h"
#include "feplb/cuda/program/timeline.h"
#include "feplb/cuda/runtime/runtime_state.h"

namespace feplb::cuda {

struct CaptureSink;  // layer/one_rank.cc

struct MoeLayer::Impl final : ProgramHooks {
  using Clock = std::chrono::steady_clock;

  Impl(std::shared_ptr<EpRuntime::State> runtime, const LayerConfig& config,
       std::unique_ptr<Planner> planner);
  ~Impl() override;

  std::shared_ptr<EpRuntime::State> rt;
  LayerConfig cfg;
  std::unique_ptr<Planner> planner;
  int layer_id = 0;
  int64_t K = 1;
  LayoutCapacity capacity;

  Event ev_grads_done;  // the helpers' weight gradients of the last backward added in
  Timeline forward_timeline, backward_timeline;
  Executor exec;        // the caller's thread
  Executor sched_exec;  // the scheduler's thread

  // The current call's programs (reused: no allocation once warm).
  StepList prologue, body, inputs;

  // The scheduler's job of the current call (see above).
  struct Job {
    MicroBatchState* h = nullptr;
    uint32_t seq = 0;  // the call's number
    bool backward = false;
    bool dispatched = false;
    bool runs = false;             // the plan is usable: the copies are issued and the call goes on
    bool planned = false;          // forward: the planner planned this step (it observes it)
    double prime_us = 0;           // forward: the planner primed while the counts travelled
    bool prime_overtaken = false;  // forward: the counts arrived during the prime
    bool prefetched = false;       // forward: the pending prefetch is this layer's
    Buf rows = Buf::kXHome;        // where the phase-2 input rows are
    const bf16* caller_rows = nullptr;  // backward_dispatched: the caller's dY rows
    int64_t bad_ids = 0;  // forward: (token, k) pairs of rank bad_rank with an id out of range
    int bad_rank = 0;
    std::string error;  // forward: the plan does not match what the layer runs (every rank alike)
    std::vector<uint8_t> recopy;  // [plan slices] backward: the helper's slot needs the weights
    Clock::time_point plan_ready;
  } job;
  std::vector<ExpertParams> experts;  // [experts_per_rank] the caller's weights, for the job

  // Host work at the caller's program steps: its inputs.
  int64_t carve_pairs = 0;                   // kCarveTokens: tokens * top_k
  std::span<const int64_t> rows_per_expert;  // kStageCounts
  std::span<const Copy> predicted;           // kStartPrefetch
  std::vector<int> pre_slot, pre_next;
  std::vector<PrefetchCopy> pre_copies;

  ForwardStats fstats;
  BackwardStats bstats;
  // The current call's host time on the caller's thread (Bindings::host points here).
  HostTimes call_host;
  Clock::time_point call_start;
  int64_t call_gemms0 = 0;
  void start_host(Bindings& b);
  HostTimes finish_host();
  template <typename Fn>
  void timed(double& acc_us, Fn&& fn) {
    const auto t0 = Clock::now();
    fn();
    acc_us += std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  }
  Plan last_plan;
  RoutingStep last_routing;

  // What the layer's recent plans took (PlannerClock::recent_us; 0 before any: the modes' times
  // measured when the runtime was made stand), sent with every forward's counts
  // (KernelId::kPlannerTime, kStageCounts). Every rank's largest is the time the next plan's
  // modes are compared at (Planner::set_recent_plan_us), so that all plan alike.
  PlannerClock clock;
  // RuntimeConfig::prime_planner: the decayed share of recent primes that the counts overtook
  // (each delayed its plan by what was left of it); from half on, the layer primes only every
  // kPrimeRetry-th forward, to see whether the counts come later again.
  double prime_overtaken = 0;
  static constexpr uint32_t kPrimeRetry = 16;
  PinnedBuffer<int32_t> planner_us{1};  // written by the scheduler, read by the copy and the host
  int32_t recent_us = 0;                // the job's: every rank's largest (routing_from_counts)

  // One rank, rows counted on the GPU (build_forward_one_rank): the call never waits for its
  // counts. Each forward copies its rows per expert into the next entry of this ring (pinned)
  // and records `copied`; the layer's later calls settle the entries whose copies are done, in
  // order (the routing and plan of that forward, and the error of out-of-range expert ids),
  // waiting only when the ring is full; the statistics' readers settle all of them.
  struct RowCounts {
    PinnedBuffer<int32_t> counts;  // [E + 1]
    Event copied;
    uint32_t seq = 0;  // the forward's call number
    int64_t pairs = 0;
    int slot = -1;
    uint64_t generation = 0;
  };
  static constexpr size_t kRowCountRing = 8;
  std::vector<RowCounts> row_counts;
  size_t row_counts_head = 0, row_counts_pending = 0;
  // Whether this forward runs on one rank with its rows counted on the GPU: one rank, the grouped
  // GEMMs chosen for its batch (RuntimeConfig::expert_gemm), at most kFfnItemsPerLaunch experts,
  // 16-byte aligned weights, no prefetch pending.
  bool one_rank_runs(std::span<const ExpertParams> w, int64_t num_tokens) const;
  void run_forward_one_rank(MicroBatch& handle, MicroBatchState& h, Bindings& b);
  void run_backward_one_rank(MicroBatch& mb, MicroBatchState& h, GradMode mode, Bindings& b);
  void stage_row_counts(const Bindings& b);
  // Settles the ring's done entries (`all`: every entry, waiting for their copies; the oldest
  // also when the ring is full; the wait into `t->await_us`). Throws InputError for a forward
  // with expert ids out of range.
  void settle_row_counts(bool all, HostTimes* t = nullptr);
  void settle_ring(bool all, double& waited_us);
  void settle(const RowCounts& c);
  // A forward's rows per expert (`counts` [E + 1]: the last entry counts the ids out of range)
  // into last_routing and last_plan; InputError for ids out of range.
  void settle_counts(const int32_t* counts, int64_t pairs, uint32_t seq);

  // CUDA graphs (one rank, rows counted on the GPU; docs/gpu.md, "CUDA graphs"). A captured
  // forward copies its rows per expert into a slot of the sink's pinned block, and a captured host
  // node hands them to the sink at every replay; the layer's next call (or statistics reader)
  // settles the latest replay's, as the ring does for calls. Each captured forward holds its slot
  // until its graph is destroyed (a CUDA user object the graph owns gives it back); the sink
  // outlives the layer while a graph holds it.
  std::shared_ptr<CaptureSink> capture_sink;  // one rank only
  void make_capture_sink();
  static constexpr int kCapturedForwards = 16;  // the layer's captured forwards alive at once
  // InputError naming `who` unless this call can be captured: one rank, no call thread, rows
  // counted on the GPU (`forward`: one_rank_runs for these weights).
  void require_capturable(const char* who, std::span<const ExpertParams> w,
                          int64_t num_tokens) const;
  void stage_captured_counts(const Bindings& b);
  void settle_captured();

  // ProgramHooks.
  void host(HostAction action, Bindings& b) override;
  void marked(Mark mark, bool backward, Clock::time_point t) override;

  // The calls' work, run by the caller's thread, or with the runtime's call thread
  // (RuntimeConfig::call_thread) by that thread on its stream (layer/moe_layer.cc).
  // `captured`: the stream is being captured into a CUDA graph (checked by the caller).
  void forward_now(MicroBatch& handle, std::span<const ExpertParams> weights, const bf16* hidden,
                   const int32_t* topk_idx, const float* topk_weight, int64_t num_tokens, bf16* out,
                   cudaStream_t stream, bool captured = false);
  void backward_now(MicroBatch& mb, std::span<const ExpertParams> weights, const bf16* grad_out,
                    const float* topk_weight, bf16* grad_hidden, float* grad_topk_weight,
                    std::span<const ExpertGrads> grads, GradMode mode, cudaStream_t stream,
                    bool captured = false);
  void forward_dispatched_now(MicroBatch& handle, std::span<const ExpertParams> weights,
                              const bf16* rows, std::span<const int64_t> counts, int64_t n,
                              bf16* out_rows, cudaStream_t stream);
  void backward_dispatched_now(MicroBatch& mb, std::span<const ExpertParams> weights,
                               const bf16* grad_out_rows, bf16* grad_rows,
                               std::span<const ExpertGrads> grads, GradMode mode,
                               cudaStream_t stream);
  // A micro-batch state for `handle` holding `rows` rows (the caller's thread, before a call is
  // queued: the handle is returned at once); with the call thread, the memory of dropped handles
  // is given back first where every state is taken.
  void acquire_batch(MicroBatch& handle, int64_t rows, bool dispatched);
  // A handle on state `slot` of `generation` for the call thread's work (empty for slot -1).
  MicroBatch adopt(int slot, uint64_t generation) const;
  bool keeps_rows_via_homes = false;  // forward_dispatched checked the planner (caller's thread)

  // Checks of the caller's arguments.
  void validate_experts(std::span<const ExpertParams> w, int64_t num_tokens, const char* who) const;
  void validate_grads(std::span<const ExpertGrads> grads, const char* who) const;
  void require_aligned(const void* p, const char* who, const char* what) const;
  MicroBatchState& consumed(MicroBatch& mb, bool dispatched, const char* who) const;

  // Calls (layer/calls.cc).
  CallFacts facts(bool dispatched) const;
  MicroBatchState& begin_forward(MicroBatch& handle, int64_t rows, bool dispatched, Bindings& b,
                                 CallFacts& f);
  void check_plan(const MicroBatchState& h, const CallFacts& f, Bindings& b);
  void carve_plan(MicroBatchState& h, int64_t home_rows, bool own_x_home, cudaStream_t s);
  void run_forward_body(MicroBatch& handle, MicroBatchState& h, const CallFacts& f, Bindings& b);
  void run_backward(MicroBatch& mb, MicroBatchState& h, GradMode mode, Bindings& b);
  void run_prefetch(std::span<const ExpertParams> w, cudaStream_t stream);
  void begin_job(MicroBatchState& h, bool backward, bool dispatched,
                 std::span<const ExpertParams> w);

  // The scheduler's job (layer/scheduler_job.cc).
  static void run_job(void* self);
  void plan_job();
  void wait_counts() const;
  void routing_from_counts(MicroBatchState& h);
  void check_prefetched(const MicroBatchState& h, int64_t& hits);
  void issue_inputs();
};

}  // namespace feplb::cuda
