// EpRuntime: one rank's FEPLB runtime, shared by every MoE layer of the rank and alive for the
// job. It owns what lives longer than one call: the peer-registered arenas phase-2 copies land in,
// the guest weight slots and gradient staging (ExpertSlotPool), the signals, two copy streams, the
// GEMM engine, the one scheduler thread of the rank (it plans and issues phase-2 copies; it sleeps
// when there is nothing to plan), and the pool of micro-batch states. It borrows the transport.
// Nothing here belongs to a micro-batch: MoeLayer::forward returns a MicroBatch handle with that.
//
//   EpRuntime rt(config, transport);                        // collective: registers peer buffers
//   MoeLayer layer(rt, {.top_k = 8}, make_gpu_planner(rt, "feplb"));
//   MicroBatch mb = layer.forward(experts, hidden, idx, w, S, out, stream);
//   layer.backward(std::move(mb), experts, grad_out, w, grad_hidden, grad_w, grads,
//   GradMode::kAccumulate, stream); layer.sync_gradients(stream);                           //
//   before an optimizer reads `grads`
//
// Public header: CUDA runtime types only (no fmt, no cuBLAS).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "feplb/core/errors.h"
#include "feplb/core/expert_shape.h"
#include "feplb/core/knobs.h"
#include "feplb/core/planners/planner.h"
#include "feplb/core/topology.h"
#include "feplb/cuda/transport.h"

namespace feplb::cuda {

// Device memory for what a micro-batch keeps from forward to backward (its saved activations),
// taken at every forward and given back when its backward ends (or its handle is dropped): e.g.
// a framework's caching allocator. Both calls are stream-ordered on `stream`. allocate() throws
// (or returns null, which the runtime reports as out of memory) when it cannot.
class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t bytes, cudaStream_t stream) = 0;
  virtual void deallocate(void* ptr, size_t bytes, cudaStream_t stream) = 0;
};

// How the expert GEMMs run. kGrouped: one grouped GEMM per GEMM stage of a batch of experts,
// sizes and pointers read on the GPU (CUTLASS's Hopper kernels: compute capability 9.0, H100 and
// H200); kPerExpert: one cuBLASLt GEMM per expert and stage, row counts from the host (any GPU);
// kAuto: where the GPU runs the grouped kernels, grouped for every batch but those of large items
// (GroupedFfn::faster_than_per_expert: few launches, each hidden behind its GEMM), else per
// expert.
enum class ExpertGemm { kAuto, kGrouped, kPerExpert };

// Where a layer's calls run (RuntimeConfig::call_thread). kOn: on the runtime's call thread. The
// caller's thread checks the arguments, queues the call and returns without waiting for the
// counts or the plan; the caller's stream waits (a stream memory wait, no SM) until the call's
// work, which the call thread enqueues on its own stream after the caller's prior work, is done.
// Needs several ranks, the grouped expert GEMMs (compute capability 9.0; every batch then runs
// grouped) and more than one hardware queue (CUDA_DEVICE_MAX_CONNECTIONS unset or above 1: with
// one, the caller's waiting stream holds up the call thread's work). An error of a queued call is
// raised by the runtime's next call (or synchronize(), or a statistics read) and leaves the
// runtime unusable; the outputs of the calls that failed or were queued behind are NaN.
// kOff: the caller's thread runs the call itself. kAuto: kOn where its needs are met.
enum class CallThread { kOff, kOn, kAuto };

struct RuntimeConfig {
  Topology topo = Topology::contiguous(1, 8, 1);
  ExpertShape shape;       // every layer's experts: bf16, hidden and ffn positive multiples of 8
  int max_top_k = 8;       // the largest top_k of the runtime's layers (sizes the buffers)
  int64_t max_tokens = 0;  // tokens per rank per call, at most
  Knobs knobs;             // max_num_dyn = guest weight slots; planners' knobs
  int64_t recv_capacity_rows =
      0;  // rows a rank may receive in phase 1; 0: R * max_tokens * max_top_k
  int64_t guest_capacity_rows = 0;  // guest rows a rank may compute; 0: 2 * max_tokens * max_top_k
  int staging_slots = -1;           // fp32 gradient staging slots; -1: default_staging_slots(knobs)
  int max_in_flight =
      16;                // micro-batches alive at once (forward done, backward not yet), all layers
  bool training = true;  // backward: gradient slots and staging; false: forward only
  bool timing = false;   // CUDA timing events per call (benchmarks): ForwardStats, BackwardStats
  double timeout_s = 60.0;         // a peer (or the GPU) silent this long is an Error, never a hang
  Allocator* allocator = nullptr;  // saved activations; null: the runtime's stream-ordered pool
  bool sync_before_counts = false;  // benchmarks: the host waits for the counts all-gather, so
                                    // counts -> plan latency excludes waiting for slower ranks
  std::string name = "feplb";       // names the peer buffers: unique per runtime in a process
  // feplb's default planner (planner_budget_us -1) compares its modes at its plans' time on the
  // slowest rank's host (FeplbChooser::set_recent_plan_us: a two-phase plan's copies start later
  // than its reserve, a one-hop plan delays the dispatch longer): measured when the runtime is
  // made (each two-phase mode's p90 on synthetic micro-batches, tens to hundreds of milliseconds
  // once), then the third longest of the layer's last 64 plans in its mode (about their p97),
  // sent with every forward's counts; every rank's largest, so that every rank's plans still
  // agree. The plans keep the knobs' reserve either way. false: the knobs' rule alone.
  bool measure_planner = true;
  // While a forward's counts travel to the host, the layer's scheduler thread primes its planner
  // (Planner::prime: the layer's last micro-batch planned again, into the Plan the next plan
  // writes), so that the plan runs from warm caches where the rest of the step evicted it. Plans
  // are the same bytes either way; false: no priming (the counts are waited for idle).
  bool prime_planner = true;
  // The expert GEMMs (ExpertGemm above). kGrouped on a GPU without the kernels: InputError.
  ExpertGemm expert_gemm = ExpertGemm::kAuto;
  // Where a layer's calls run (CallThread above). kOn where the needs are not met: InputError.
  CallThread call_thread = CallThread::kOff;
};

// Staging slots a training runtime gets by default: every expert slice a rank may export under
// the feplb planner's limits (dyn x max_helpers_per_expert), and at least max_num_dyn.
int default_staging_slots(const Knobs& knobs);

class EpRuntime {
 public:
  // Collective over the transport's ranks: every rank constructs its runtime with the same
  // configuration (peer buffers are registered). `transport` must outlive the runtime and every
  // layer made from it. Throws InputError for an impossible configuration, Error otherwise.
  EpRuntime(const RuntimeConfig& config, Transport& transport);
  // Destroying the runtime while layers still use it is allowed: their later calls throw
  // InputError, and the memory is released with the last of them.
  ~EpRuntime();
  EpRuntime(const EpRuntime&) = delete;
  EpRuntime& operator=(const EpRuntime&) = delete;

  const RuntimeConfig& config() const;
  int rank() const;
  int world_size() const;
  Transport& transport() const;
  // Device memory the runtime holds for the job (arenas, slots, staging, scratch), and the bytes
  // live micro-batches keep now (saved activations, from the allocator).
  size_t workspace_bytes() const;
  size_t saved_bytes() const;
  int micro_batches_in_flight() const;
  // CPU time the scheduler thread has used so far (seconds).
  double scheduler_cpu_seconds() const;
  // RuntimeConfig::measure_planner: feplb's two-phase modes and their planning time measured
  // when the runtime was made (ModeTime::us: every rank's largest p90, the speed a layer's feplb
  // planner assumes until its own plans are timed; p99_us: this rank's). Empty when not measured
  // (or where the reserve is the knob's).
  std::span<const ModeTime> planner_times() const;
  // Waits for `stream`'s work, bounded by the configuration's timeout_s: Error if it does not
  // finish, and as soon as the transport reports a failed peer (Transport::peer_failure: a peer
  // process that exited, the communicator's asynchronous error), naming it. Use it instead of
  // cudaStreamSynchronize, which waits forever for a step a dead peer never completes. After
  // such an Error, abort the communicator and leave the process: streams may still wait on the
  // dead peer's work, and destroying the runtime waits for its copy streams.
  void synchronize(cudaStream_t stream) const;
  // The expert GEMMs this runtime runs: kGrouped, kPerExpert, or kAuto where it chooses per batch
  // (the configuration's kAuto on a GPU with the grouped kernels).
  ExpertGemm expert_gemm() const;
  // Whether the layers' calls run on the runtime's call thread (RuntimeConfig::call_thread).
  bool call_thread() const;

 private:
  // Its state (defined in the library), shared with its layers and micro-batch handles, which
  // keep it alive.
  struct State;
  friend class MoeLayer;
  friend class MicroBatch;
  std::shared_ptr<State> state_;
};

}  // namespace feplb::cuda
