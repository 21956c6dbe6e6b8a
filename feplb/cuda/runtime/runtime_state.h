// What an EpRuntime owns (shared with its layers and micro-batch handles, which keep it alive),
// and the state of one micro-batch between its forward and its backward. Internal to feplb_cuda
// (never installed): an EpRuntime's private State is a RuntimeState; nothing here includes the
// layer.
#pragma once

#include <cuda_bf16.h>

#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <vector>

#include "feplb/core/plan.h"
#include "feplb/core/planners/planner.h"
#include "feplb/core/routing.h"
#include "feplb/cuda/base/resources.h"
#include "feplb/cuda/gemm/gemm.h"
#include "feplb/cuda/gemm/grouped_ffn.h"
#include "feplb/cuda/gemm/refiner.h"
#include "feplb/cuda/host/job_thread.h"
#include "feplb/cuda/host/step_layout.h"
#include "feplb/cuda/runtime.h"
#include "feplb/cuda/runtime/call_queue.h"
#include "feplb/cuda/runtime/signal_board.h"
#include "feplb/cuda/runtime/slot_pool.h"
#include "feplb/cuda/stats.h"

namespace feplb::cuda {

using bf16 = __nv_bfloat16;

// Device memory of one micro-batch, carved out of two allocations: one sized by the token count
// (taken at the start of the forward), one by the plan (taken once the plan is known).
//   pair_pos [S*K] int32   send row of each (token, k) pair
//   y_send   [S*K, H]      expert outputs in send order (for d topk_weight)
//   x_home   [recv, H]     rows at this rank's experts after phase 1
//   gu_home  [recv, 2F], act_home [recv, F]     (their gate|up and activation; backward: gradients)
//   x_guest  [guest, H], gu_guest [guest, 2F], act_guest [guest, F]   the same for guest rows
// A one-rank forward (rows counted on the GPU) carves everything from the first: its rows at home
// are its S*K pairs in expert order (recv = S*K), and
//   expert_rows [E + 1] int32   rows per expert, then the pairs with an id out of range
//   expert_row0 [E] int32       where each expert's rows start
struct MicroBatchState {
  uint64_t generation = 0;
  bool in_use = false;
  int layer_id = -1;
  uint32_t forward_seq = 0;
  int64_t num_tokens = 0;         // tokens; with dispatched rows, the rows at home
  bool dispatched = false;        // forward_dispatched: x_home is the caller's rows
  bool one_rank = false;          // rows counted on the GPU (build_forward_one_rank)
  bool captured = false;          // the forward was captured into a CUDA graph (one rank)
  cudaStream_t stream = nullptr;  // the forward's: the memory was allocated on it
  RoutingStep routing;
  Plan plan;
  StepLayout layout;
  ForwardStats stats;
  void* mem_tokens = nullptr;
  size_t bytes_tokens = 0;
  void* mem_plan = nullptr;
  size_t bytes_plan = 0;
  int32_t* pair_pos = nullptr;
  int32_t *expert_rows = nullptr, *expert_row0 = nullptr;
  bf16 *y_send = nullptr, *x_home = nullptr, *gu_home = nullptr, *act_home = nullptr;
  bf16 *x_guest = nullptr, *gu_guest = nullptr, *act_guest = nullptr;
};

// Weights before routing (MoeLayer::prefetch) that no call has settled yet: the runtime's next
// call uses them (that layer's forward) or drops them. The same on every rank.
struct PendingPrefetch {
  bool active = false;
  int layer_id = -1;
  uint32_t seq = 0;                // the prefetch call's: the value of its landed signals
  std::vector<Copy> copies;        // kPrefetchWeights in issue order, every rank's
  std::vector<int> slots;          // [copies] the guest slot on the copy's helper
  std::vector<uint8_t> into_here;  // [R] owners that prefetched into this rank
  std::vector<uint8_t> targets;    // [R] ranks some owner prefetched into
};

// Buffers of one call at a time (every call starts after the previous one's work on the GPU),
// sized once by the runtime; the executor binds the named buffers of a program to them. Rows of
// H bf16 unless said otherwise.
struct CallArenas {
  DeviceBuffer<bf16> send;      // [max_pairs, H] X (forward) or dY (backward) in send order
  DeviceBuffer<bf16> ybuf;      // [max_pairs, H] backward: dX back in send order
  DeviceBuffer<bf16> dyrecv;    // [recv_cap, H] backward: dY at the experts' homes
  DeviceBuffer<bf16> yrecv;     // [recv_cap, H] Y (forward) or dX (backward) at home; peers write
  DeviceBuffer<bf16> guest_in;  // [guest_cap, H] guests' X (forward) or dY (backward); owners write
  DeviceBuffer<bf16> guest_out;  // [guest_cap, H] guests' Y or dX
  // [E + 2]: rows per expert, then out-of-range ids, then the layer's recent planner time (us;
  // MoeLayer's planner clock), gathered with them so that every rank reserves alike.
  DeviceBuffer<int32_t> counts;
  DeviceBuffer<int32_t> chunk_rows;      // [kernels::kMaxChunks, E] the scatter's per-chunk rows
  DeviceBuffer<int32_t> offsets, order;  // [E]
  DeviceBuffer<int32_t> counts_all;      // [R, E + 2] every rank's counts
  PinnedBuffer<int32_t> counts_host;     // [R, E + 2] (dispatched rows: [R, experts_per_rank + 1])
  std::vector<bf16*> peer_yrecv, peer_guest_in;  // [R] peers' arenas as addressed here

  size_t device_bytes() const;
};

// The rank's streams besides the caller's, and the events that order a call's steps across them
// (program/step_program.h, StreamId and EventId).
struct CallStreams {
  Stream copy_in;   // phase-2 inputs and prefetched weights (first in, first out)
  Stream copy_out;  // results back
  Event ev_counts, ev_dispatched, ev_copy_in_done, ev_guest_ready, ev_guest_done, ev_copy_out_done,
      ev_call_done;
  Event ev_prefetch_ready,
      ev_prefetch_done;  // the prefetch's stream work before its copies; its copies
};

// The order of the rank's calls and what passes between them: whether the runtime is open and a
// call is in progress, the host hand-offs of the current call (its number: SignalBoard::call())
// between the caller's thread and the scheduler's (program/step_program.h, HostFlag: the plan is
// ready, phase 1 is posted, the phase-2 input copies are issued; each published with release and
// read with acquire, so what the publishing thread wrote before, the plan, the layout, the stats,
// is visible after), the scheduler's failure, and the prefetch a later call settles.
struct CallOrder {
  std::atomic<bool> open{true};
  std::atomic<bool> in_call{false};
  std::atomic<uint32_t> plan_seq{0}, copies_seq{0}, dispatched_seq{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  PendingPrefetch pending;  // weights before routing not settled yet (the same on every rank)
};

// The micro-batch states between forwards and their backwards (MicroBatch handles index them);
// handles may be dropped from any thread.
struct MicroBatches {
  mutable std::mutex mu;
  std::vector<MicroBatchState> states;
  uint64_t next_generation = 1;
};

// The expert FFN's engines.
struct ExpertFfnEngines {
  GemmEngine gemm;
  GemmRefiner refiner;  // exact algorithms for the shapes `gemm` met first, in the background
  // The expert GEMMs as grouped GEMMs (RuntimeConfig::expert_gemm); null: per expert with `gemm`.
  std::unique_ptr<GroupedFfn> grouped;
};

// What an EpRuntime owns, in parts with one job each; the layer uses the parts, the executor
// those in CallParts.
struct RuntimeState {
  RuntimeState(const RuntimeConfig& config, Transport& transport);
  ~RuntimeState();

  // Throws the scheduler's or a queued call's stored error, or InputError when the runtime was
  // destroyed.
  void check_usable(const char* who) const;
  // With the call thread: waits until every call queued so far has run (not on that thread).
  void drain_calls() const;
  // Throws Error naming the failed peer when the transport reports one (Transport::peer_failure),
  // saying what this rank was waiting for.
  void check_peers(const char* waiting_for) const;
  // Waits for `stream`'s work, bounded by the timeout, polling check_peers.
  void sync(cudaStream_t stream, const char* what) const;
  // A free micro-batch state (InputError when max_in_flight are alive), marked in use by
  // `layer_id`.
  int acquire(int layer_id);
  // Gives the memory of state `slot` back (stream-ordered on `stream`; null: the forward's) and
  // frees the state, if it is still generation `generation`. With the call thread, from another
  // thread: queued behind the calls queued so far.
  void release(int slot, uint64_t generation, cudaStream_t stream) noexcept;
  void* allocate(size_t bytes, cudaStream_t stream);
  size_t saved_bytes() const;
  // RuntimeConfig::measure_planner: planner_times, measured here and agreed (collective).
  void measure_planner_times();
  // The call's buffers (CallArenas), sized from the configuration; those peers write into
  // registered with the transport.
  void make_arenas();
  // RuntimeConfig::call_thread resolved for `world` ranks (InputError for kOn where its needs
  // are not met).
  static bool wants_call_thread(const RuntimeConfig& c, int world, bool grouped_here);

  RuntimeConfig cfg;
  Transport& transport;
  // RuntimeConfig::measure_planner: feplb's modes and their planning time on the slowest rank's
  // host (us); empty when not measured. Layers' planners reserve at least these.
  std::vector<ModeTime> planner_times;
  int rank = 0, world = 1, experts_per_rank = 0;
  int64_t H = 0, F = 0, E = 0, max_pairs = 0, recv_cap = 0, guest_cap = 0;
  int next_layer_id = 0;

  std::unique_ptr<Allocator> own_allocator;
  Allocator* allocator = nullptr;
  std::unique_ptr<ExpertSlotPool> pool;
  CallArenas arena;
  // The named signals (weights and rows landed, results back, dW back, slots quiet, prefetch
  // landed), their slot layout and value sequences: the call numbers, each rank's slots-quiet
  // count (updated identically on every rank).
  std::unique_ptr<SignalBoard> board;
  CallStreams streams;
  ExpertFfnEngines ffn;
  CallOrder calls;
  MicroBatches batches;

  JobThread scheduler;  // joined before the buffers its jobs use go away
  // RuntimeConfig::call_thread: the calls' thread (null: the caller's thread runs them). Last:
  // its queued calls run before anything else goes away.
  std::unique_ptr<CallQueue> call_queue;
};

// What a call's step programs run with (program/executor.h): the parts of a runtime the
// executor reads or writes, and none other (not the micro-batch states, the allocator, the
// planner times or the scheduler's thread). References into the RuntimeState it was made from.
struct CallParts {
  explicit CallParts(RuntimeState& r);

  // RuntimeState::check_peers and sync.
  void check_peers(const char* waiting_for) const;
  void sync(cudaStream_t stream, const char* what) const;

  const RuntimeConfig& cfg;
  int rank, experts_per_rank;
  int64_t H, F, E;
  Transport& transport;
  SignalBoard& board;
  ExpertSlotPool& pool;
  CallArenas& arena;
  CallStreams& streams;
  ExpertFfnEngines& ffn;
  CallOrder& calls;
};

// The context of a planner for a layer of a runtime of configuration `c` (make_gpu_planner):
// its topology, shape and knobs, prefetch_window_us = 0 becoming the attention block's time for
// max_tokens; `cost` null: the roofline from the knobs, owned by the context.
PlannerContext gpu_planner_context(const RuntimeConfig& c, const GemmCostModel* cost);

// The state behind an EpRuntime handle (runtime.h names it only as a private incomplete type).
struct EpRuntime::State final : RuntimeState {
  using RuntimeState::RuntimeState;
};

}  // namespace feplb::cuda
