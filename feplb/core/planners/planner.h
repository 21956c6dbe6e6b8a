// Planner: turns one (micro-batch, layer)'s routing into a Plan. One file per policy; all are
// deterministic (same inputs, same call sequence -> identical plan bytes), allocate nothing on the
// hot path after the first call, and never see a CUDA type.
#pragma once

#include <algorithm>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "feplb/core/cost_model.h"
#include "feplb/core/expert_shape.h"
#include "feplb/core/knobs.h"
#include "feplb/core/plan.h"
#include "feplb/core/routing.h"
#include "feplb/core/topology.h"

namespace feplb {

class ScheduleWriter;  // copy_links.h

// What every planner is built from. The cost model must outlive the planner.
struct PlannerContext {
  Topology topo;
  ExpertShape shape;
  Knobs knobs;
  const GemmCostModel* cost = nullptr;
  // The placement's dynamic experts (docs/placement.md): [num_experts], 1 = in its home GPU's
  // dynamic set; empty when there is no placement. Used by feplb (feplb_dyn_set = 1) and
  // feplb-paper (paper_dyn_set = 2).
  std::vector<uint8_t> dynamic = {};
  // Keeps `cost` alive where the context owns it (a planner made for the GPU layer); else empty.
  std::shared_ptr<const GemmCostModel> cost_owner = {};
};

// The data movement a policy relies on, and the SMs it holds while it moves data (the SMs the
// expert GEMMs cannot use meanwhile). Numbers come from knobs (deepep_sms, nccl_sms, moonep_sms)
// as the anchors publish them; 0 for copy-engine moves. Printable, for the reports.
struct DataMovement {
  std::string_view dispatch;  // phase 1: tokens to the GPUs that compute them, outputs back
  int64_t dispatch_sms = 0;
  std::string_view balance;  // how the balancing moves weights and rows ("none" if nothing)
  int64_t balance_sms = 0;   // held while the balancing moves data
  bool balance_every_micro_batch = true;  // false: only at replans, between micro-batches
};

// One of a planner's modes and its planning time on this host (us): measure_mode_times().
struct ModeTime {
  std::string mode;
  double us = 0;      // the p90 of the measured plans: the time the mode is compared at
  double p99_us = 0;  // their p99 (shown; not reserved: one rank's start-up spikes would hold it)
};

class Planner {
 public:
  explicit Planner(const PlannerContext& ctx);
  virtual ~Planner();
  virtual std::string_view name() const = 0;
  // The rules validate() holds this planner's plans to.
  virtual PlanLimits limits() const;
  // The data movement its plans assume (default: DeepEP dispatch, copy-engine balancing).
  virtual DataMovement data_movement() const;
  // Plans one step and writes the plan's schedule (Plan::schedule: when its copies run, the order
  // each GPU runs its guests in). `routing.expert_counts` must be filled. Overwrites `out`. Does
  // not change the planner's state, so it may be called repeatedly (timing) with identical results.
  void plan(const RoutingStep& routing, Plan& out);
  // Writes the schedule of a plan made outside plan() (the GPU layer's one-rank plans) as plan()
  // writes its plans'.
  void write_schedule(Plan& out);
  // Called once per step after planning it, for planners that learn from history.
  virtual void observe(const RoutingStep& /*routing*/) {}
  // Brings the planner's code and the tables its plans read back into the CPU's caches: plans
  // layer `layer`'s last observed micro-batch again into `scratch` (overwritten: pass the Plan the
  // next plan() writes, so that its buffers are warm too), with its schedule (feplb's also read
  // their tables by row count whole), and changes nothing else (the next plans are the same bytes
  // as without it). Nothing (false) where the planner keeps no such micro-batch (feplb's planners
  // keep one per layer once it is observed; the refined one-hop planner none). A caller whose
  // thread waits for the next counts calls it meanwhile: on a host where the rest of the training
  // step has evicted the planner, the plan then runs from warm caches instead of cold ones
  // (docs/planners.md, "Cold caches").
  bool prime(int64_t layer, Plan& scratch);
  // The weight copies to start before the next micro-batch of `layer` is routed
  // (CopyKind::kPrefetchWeights, home -> predicted helper, in issue order), predicted from what
  // this planner observed; the next plan() of that layer lists exactly these. Empty for planners
  // that do not prefetch. Valid until the next observe().
  virtual std::span<const Copy> prefetch(int64_t /*layer*/) const { return {}; }
  // From now on, plans only rows dispatched to their experts' homes (PlanLimits::rows_via_homes)
  // where this planner can: a GPU layer whose caller dispatched the rows itself asks for it. The
  // default changes nothing (limits() says what it plans); feplb's chooser drops its one-hop modes.
  virtual void keep_rows_via_homes() {}
  // Grows the tables its plans read (feplb's GEMM time by rows) to cover micro-batches whose
  // busiest expert has up to `max_expert_rows` rows, so that no later plan grows them: a plan that
  // grows them computes each new entry (about 1,000 instructions each with the roofline model:
  // milliseconds for a few thousand rows). Plans are the same either way. The default: nothing.
  virtual void warm(int64_t /*max_expert_rows*/) {}
  // Where the planner keeps a reserve of its own ahead of its copies (feplb's chooser, the
  // planner_budget_us knob at -1): the planning time of each of its modes that reserves one, on
  // this host, measured on a fresh planner of the same context (synthetic micro-batches of
  // `rows_per_rank` rows per rank): a prior, until the layer's own plans are timed. Empty
  // otherwise. Takes milliseconds; changes nothing here.
  virtual std::vector<ModeTime> measure_mode_times(int64_t /*rows_per_rank*/) const { return {}; }
  // The planning time of its modes on the slowest rank's host (measure_mode_times, every rank's
  // largest): a planner with a reserve of its own (feplb's chooser) compares its modes at that
  // host's speed until its own plans are timed (set_recent_plan_us). Modes not named are ignored.
  // Every rank must pass the same times (the GPU runtime passes every rank's largest), or their
  // plans differ. Call before the first plan.
  virtual void set_host_times(std::span<const ModeTime> /*times*/) {}
  // What this layer's recent plans took, us (PlannerClock::recent_us; 0: not known), on the
  // slowest rank's host: a planner with a reserve of its own (feplb's chooser) compares its modes
  // at that host's speed (its plans keep their reserve). Every rank must pass the same, or their
  // plans differ.
  virtual void set_recent_plan_us(double /*us*/) {}

 protected:
  // The policy's plan of one step, as plan() says, without the schedule.
  virtual void make_plan(const RoutingStep& routing, Plan& out) = 0;
  // prime()'s plan, without the schedule; false: nothing planned (the default).
  virtual bool prime_plan(int64_t /*layer*/, Plan& /*out*/) { return false; }
  // The GEMM times the schedule writer reads: the context's cost model, or the same numbers from
  // a table the planner's own plans read (feplb's: one table by row count, not two).
  virtual const GemmCostModel& schedule_cost() const { return *ctx_.cost; }

  const PlannerContext ctx_;

 private:
  std::unique_ptr<ScheduleWriter> schedule_;
};

// Names of every planner, in the order `feplb simulate` lists them by default.
const std::vector<std::string>& planner_names();
// Throws InputError for an unknown name (listing the known ones).
std::unique_ptr<Planner> make_planner(std::string_view name, const PlannerContext& ctx);

// Sorts ids by key(id), largest first (or smallest first), ties to the lower id: the order a
// stable sort of ascending ids gives, without the scratch buffer std::stable_sort allocates.
template <typename Key>
void sort_ids_descending(std::vector<int>& ids, const Key& key) {
  std::sort(ids.begin(), ids.end(),
            [&](int a, int b) { return key(a) != key(b) ? key(a) > key(b) : a < b; });
}
template <typename Key>
void sort_ids_ascending(std::vector<int>& ids, const Key& key) {
  std::sort(ids.begin(), ids.end(),
            [&](int a, int b) { return key(a) != key(b) ? key(a) < key(b) : a < b; });
}

// Shared by planners: total rows per GPU when every expert stays home.  // [num_ranks]
void home_loads(const Topology& topo, const RoutingStep& routing, std::vector<int64_t>& loads);

// Shared by planners: the placement's dynamic experts of `gpu` (ctx.dynamic), ascending, into
// `out`; without a placement, its `dyn` lowest-numbered experts (the paper's fixed set).
void placement_dynamic_set(const PlannerContext& ctx, int gpu, std::vector<int>& out);

}  // namespace feplb
