// Running a routing trace on this GPU: the real MoeLayer with the trace's ranks as virtual ranks
// (one thread each), and each rank's GEMM work timed alone (the layer time R real GPUs would see).
// Used by `feplb run` and bench/gpu.
#pragma once

#include <string>
#include <vector>

#include "bench/harness/expert_bench.h"
#include "feplb/core/expert_shape.h"
#include "feplb/core/knobs.h"
#include "feplb/core/plan.h"
#include "feplb/core/planners/planner.h"
#include "feplb/core/routing.h"
#include "feplb/core/topology.h"
#include "feplb/cuda/runtime.h"

namespace feplb::cuda {

// Virtual ranks put 3 streams each on one GPU; give each its own hardware queue. Call before the
// first CUDA call of the process.
void request_stream_connections();

// The most rows any rank receives in phase 1 over the trace's steps (a layer's recv capacity for
// it, instead of the dropless worst case of R x tokens x top_k rows).
int64_t worst_receiver_rows(const Trace& trace, const Topology& topo);

struct VirtualLayerStats {
  std::vector<double> counts_to_first_copy_us;  // ranks that issued phase-2 copies
  std::vector<double> counts_to_host_us, plan_us;
  // Primes while the counts travelled (ForwardStats::prime_us > 0, every rank's), and how many of
  // them the counts overtook.
  std::vector<double> prime_us;
  int primes_overtaken = 0;
  // Two-phase plans (every rank's): the planner time each reserved ahead of its copies, and its
  // plan_us in the same order.
  std::vector<double> plan_reserve_us, reserved_plan_us;
  std::vector<std::string> plan_modes;  // rank 0's plans' modes (Plan::mode), in order
  // The planner times rank 0's runtime measured when it was made (EpRuntime::planner_times: the
  // p90 every rank's largest, the p99 rank 0's; empty where it measured nothing).
  std::vector<ModeTime> start_times;
  std::vector<double> counts_to_plan_us;              // counts ready -> plan ready (every rank)
  std::vector<double> wait_ms, wait_pct, forward_ms;  // per rank and forward
  int forwards = 0;
};

// The layer forward over `steps` steps of `trace` (routing reproduced exactly, random weights
// and activations, 2 warm-up forwards not counted). Throws on a timeout instead of hanging.
VirtualLayerStats run_virtual_layer(const Trace& trace, const ExpertShape& shape,
                                    const std::string& policy, const Knobs& knobs, int steps,
                                    int gpus_per_node, double timeout_s,
                                    bool measure_planner = true, bool prime_planner = true,
                                    ExpertGemm expert_gemm = ExpertGemm::kAuto);

// Each rank's GEMM time (ms) for `plan`, each rank timed alone: median of `reps`.
std::vector<double> rank_gemm_ms(ExpertBench& bench, const Plan& plan, int num_ranks, int reps,
                                 ExpertBench::Gemms gemms = ExpertBench::Gemms::kPerExpert);

}  // namespace feplb::cuda
