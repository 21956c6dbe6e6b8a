// Metrics of one plan: token straggler, GEMM straggler, bytes moved (by kind and by
// link: NVLink inside a node, network between nodes), whether the phase-2 copies land inside each
// receiving GPU's static-GEMM window.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "feplb/core/cost_model.h"
#include "feplb/core/plan.h"
#include "feplb/core/routing.h"
#include "feplb/core/topology.h"

namespace feplb {

struct StepMetrics {
  double mean_rows = 0;            // mean token-expert rows per GPU
  double token_straggler = 0;      // S_T = max_d T_d - mean_d T_d (rows)
  double token_max_over_mean = 0;  // max_d T_d / mean_d T_d
  double oracle_straggler = 0;     // the floor for in-domain balancing, same step
  double gemm_straggler_ms = 0;    // S_G = max_d G_d - mean_d G_d (modelled)
  double gemm_max_ms = 0;
  int64_t weight_bytes = 0;   // weight copies: phase 2, prefetched (used or not), and
                              // replicas installed (EPLB)
  int64_t token_bytes = 0;    // phase-2 token rows to helpers + outputs back
  int64_t guest_experts = 0;  // (expert, helper) pairs holding copied weights (phase 2)
  // Every copy of the plan (weights and rows), by link: inside an NVLink domain, or between nodes.
  int64_t nvlink_bytes = 0;
  int64_t network_bytes = 0;
  // The phase-1 dispatch and combine of the rows (measure_traffic; 0 until it runs), by link. A
  // row routed from rank s to the GPU that receives it, d != s, crosses one link each way.
  int64_t dispatch_nvlink_bytes = 0;
  int64_t dispatch_network_bytes = 0;
  int64_t max_guest_slots = 0;  // max over GPUs of non-home experts held (copied or resident)
  // Weights prefetched before routing (kPrefetchWeights): copies, bytes, and those a slice used
  // (the prediction's hits); guest_weights_needed: (expert, GPU) pairs whose slice needed weights
  // this micro-batch (phase-2 weight copies + prefetch hits).
  int64_t prefetch_copies = 0;
  int64_t prefetch_bytes = 0;
  int64_t prefetch_hits = 0;
  int64_t prefetch_wasted_bytes = 0;
  int64_t guest_weights_needed = 0;
  // The window. A GPU runs the work that needs no copy first (its own experts' rows that stay on
  // it, resident replicas, then guests whose prefetched weights and dispatched rows are there),
  // then each owner's guests once that owner's copies into it have landed (a signal per owner), in
  // the order of the plan's schedule (schedule.h).
  // fits_static_window: no GPU waited for a copy (every copy landed before its receiver ran out
  // of work). window_slack_ms: min over receivers and owners of (when the receiver would reach
  // that owner's guests without waiting) - (when their copies land); < 0: it waited.
  bool fits_static_window = true;
  double window_slack_ms = 0;
  // How much later the slowest GPU finishes because copies landed late (a receiver waited, then
  // ran its guests): max_d finish_d - max_d G_d, >= 0. A receiver that waits but still finishes
  // before the slowest GPU costs nothing: fits_static_window false, copy_exposed_ms 0.
  double copy_exposed_ms = 0;
  // The plan's latency on the critical path: what planning adds to the plain EP dispatch it
  // replaces. planner_us when the plan was made before the dispatch (Plan::planned_before_dispatch:
  // the dispatch waits for it), else 0 (it runs while the dispatch and the static GEMMs do). The
  // counts' round trip to the host is not charged: the plain all-to-all-v dispatch needs the
  // per-rank counts on the host for its split sizes too.
  double plan_exposed_ms = 0;
  double planner_us = 0;
  std::string mode;  // the mode the plan was made in (Plan::mode; empty for most planners)

  // Everything the balancing adds to the layer beyond its slowest GPU's GEMMs.
  double exposed_ms() const { return copy_exposed_ms + plan_exposed_ms; }
  bool delays_layer() const { return exposed_ms() > 0; }
};

// Per-GPU view of a plan, for plots.
struct GpuLoads {
  std::vector<int64_t> home_rows;   // [num_ranks] rows of the GPU's own experts computed there
  std::vector<int64_t> guest_rows;  // [num_ranks] rows of other GPUs' experts computed there
  std::vector<double> gemm_ms;      // [num_ranks] modelled GEMM time
};

// `planner_us` is the measured planning time: the phase-2 copies start that long after the GEMMs
// (the plan's schedule assumed its reserve), or, for a plan made before the dispatch, every GPU
// starts that much later. The copies' times and each GPU's order of work are the plan's schedule
// (Plan::schedule, written by its planner; Error without one); `cost` the GEMM times of the loads.
StepMetrics measure_plan(const Plan& plan, const Topology& topo, const GemmCostModel& cost,
                         double planner_us, GpuLoads* loads = nullptr);

// Fills the dispatch_* fields of `m`: the phase-1 traffic of the plan's rows. Per expert, the rows
// that leave their source (all but kSource slices) are taken in source-rank order and handed to
// the GPUs that receive them by dispatch in ascending GPU order (MoonEP's ordinal rule, used for
// every policy): the home receives the rows of its kHome slice plus those it copies on to helpers,
// a kDispatched slice its rows. Counted per token-expert row in the expert dtype, both ways (a
// DeepEP-style dispatch sends a token once per destination GPU, so this is an upper bound).
void measure_traffic(const Plan& plan, const Topology& topo, const RoutingStep& routing,
                     const ExpertShape& shape, StepMetrics& m);

// max over domains of ceil(T_domain / GPUs) - mean rows per GPU: the best any plan can do when
// rows move only inside NVLink domains.
double oracle_token_straggler(const Topology& topo, const std::vector<int64_t>& expert_counts);

}  // namespace feplb
