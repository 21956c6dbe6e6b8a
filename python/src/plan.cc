// Planner for Python: one policy on one topology, planning [num_ranks, num_experts] counts into
// plans returned as numpy arrays. Like the C++ Planner it keeps the history some policies learn
// from (eplb, feplb-paper): plan() observes each step unless told not to.
#include "feplb/core/plan.h"

#include <pybind11/stl.h>

#include <memory>
#include <optional>

#include "feplb/core/error.h"
#include "feplb/core/limits.h"
#include "feplb/core/metrics.h"
#include "feplb/core/planners/planner.h"
#include "feplb/core/schedule.h"
#include "feplb/sim/cost_choice.h"
#include "feplb/sim/simulate.h"
#include "python/src/bindings.h"

namespace feplb::python {
namespace {

std::string_view source_name(RowSource s) {
  switch (s) {
    case RowSource::kHome:
      return "home";
    case RowSource::kSource:
      return "source";
    case RowSource::kDispatched:
      return "dispatched";
  }
  return "?";
}

std::string_view copy_kind_name(CopyKind k) {
  switch (k) {
    case CopyKind::kWeights:
      return "weights";
    case CopyKind::kTokenRows:
      return "token_rows";
    case CopyKind::kOutputRows:
      return "output_rows";
    case CopyKind::kReplicaWeights:
      return "replica_weights";
    case CopyKind::kPrefetchWeights:
      return "prefetch_weights";
  }
  return "?";
}

class PyPlanner {
 public:
  PyPlanner(const std::string& policy, const Topology& topo, const ExpertShape& shape,
            const py::dict& knob_overrides, const std::string& cost_model,
            const std::string& data_dir, const std::optional<std::vector<int64_t>>& dynamic)
      : topo_(topo), shape_(shape), knobs_(knobs_from(knob_overrides)) {
    FEPLB_REQUIRE_INPUT(shape.hidden >= 1 && shape.ffn >= 1,
                        "shape: hidden and ffn must be at least 1");
    std::vector<uint8_t> dyn;
    if (dynamic) {
      FEPLB_REQUIRE_INPUT(dynamic->size() == static_cast<size_t>(topo.num_experts()),
                          "dynamic: has {} entries, expected num_experts = {}", dynamic->size(),
                          topo.num_experts());
      for (size_t e = 0; e < dynamic->size(); ++e) {
        FEPLB_REQUIRE_INPUT((*dynamic)[e] == 0 || (*dynamic)[e] == 1,
                            "dynamic[{}]: {} is not 0 or 1", e, (*dynamic)[e]);
        dyn.push_back(static_cast<uint8_t>((*dynamic)[e]));
      }
    }
    FEPLB_REQUIRE_INPUT(!dyn.empty() || policy != "feplb" || knobs_.feplb_dyn_set == 0,
                        "feplb_dyn_set: {} needs the dynamic sets (dynamic=[num_experts] 0/1)",
                        knobs_.feplb_dyn_set);
    FEPLB_REQUIRE_INPUT(!dyn.empty() || policy != "feplb-paper" || knobs_.paper_dyn_set != 2,
                        "paper_dyn_set: 2 needs the dynamic sets (dynamic=[num_experts] 0/1)");
    cost_ = choose_cost_model(cost_model, shape, knobs_, data_dir, "cost_model");
    if (!cost_.model) cost_.model = std::make_unique<RooflineCostModel>(shape, knobs_);
    planner_ = make_planner(policy, PlannerContext{topo, shape, knobs_, cost_.model.get(), dyn});
  }

  py::dict plan(const Int64Array& counts, int64_t layer, bool observe) {
    load(counts, layer);
    Plan plan;
    // The GIL stays held: planning takes microseconds, and it keeps two Python threads from
    // planning on one Planner's state at once. Timed as the simulator times it.
    const double planner_us = timed_plan_us(*planner_, step_, plan, knobs_);
    validate(plan, topo_, step_, shape_, planner_->limits());
    if (observe) planner_->observe(step_);
    ++steps_;
    GpuLoads loads;
    StepMetrics m = measure_plan(plan, topo_, *cost_.model, planner_us, &loads);
    measure_traffic(plan, topo_, step_, shape_, m);
    return to_python(plan, m, loads);
  }

  void observe(const Int64Array& counts, int64_t layer) {
    load(counts, layer);
    planner_->observe(step_);
    ++steps_;
  }

  std::string_view policy() const { return planner_->name(); }
  const Topology& topology() const { return topo_; }
  const ExpertShape& shape() const { return shape_; }
  const std::string& cost_label() const { return cost_.label; }

 private:
  void load(const Int64Array& counts, int64_t layer) {
    FEPLB_REQUIRE_INPUT(layer >= 0, "layer: {} must be at least 0", layer);
    const int R = topo_.num_ranks(), E = topo_.num_experts();
    require_counts(counts, "counts", {R, E}, "(num_ranks, num_experts)", limits::kMaxTokensPerRank);
    step_ = RoutingStep(steps_, layer, R, E);
    std::copy(counts.data(), counts.data() + counts.size(), step_.counts.begin());
    step_.sum_experts();
  }

  py::dict to_python(const Plan& plan, const StepMetrics& m, const GpuLoads& loads) const {
    const size_t n = plan.slices.size();
    std::vector<int64_t> expert(n), home(n), gpu(n), rows(n);
    py::list source;
    for (size_t i = 0; i < n; ++i) {
      const Slice& s = plan.slices[i];
      expert[i] = s.expert;
      home[i] = topo_.home(s.expert);
      gpu[i] = s.gpu;
      rows[i] = s.rows;
      source.append(std::string(source_name(s.source)));
    }
    const size_t c = plan.copies.size();
    std::vector<int64_t> c_expert(c), c_src(c), c_dst(c), c_rows(c), c_bytes(c);
    py::list kind;
    for (size_t i = 0; i < c; ++i) {
      const Copy& cp = plan.copies[i];
      c_expert[i] = cp.expert;
      c_src[i] = cp.src_gpu;
      c_dst[i] = cp.dst_gpu;
      c_rows[i] = cp.rows;
      c_bytes[i] = cp.bytes;
      kind.append(std::string(copy_kind_name(cp.kind)));
    }
    std::vector<int64_t> r_expert, r_gpu;
    for (const ResidentReplica& r : plan.resident) {
      r_expert.push_back(r.expert);
      r_gpu.push_back(r.gpu);
    }
    py::dict metrics;
    metrics["mean_rows"] = m.mean_rows;
    metrics["token_straggler"] = m.token_straggler;
    metrics["token_max_over_mean"] = m.token_max_over_mean;
    metrics["oracle_straggler"] = m.oracle_straggler;
    metrics["gemm_straggler_ms"] = m.gemm_straggler_ms;
    metrics["gemm_max_ms"] = m.gemm_max_ms;
    metrics["guest_experts"] = m.guest_experts;
    metrics["max_guest_slots"] = m.max_guest_slots;
    metrics["nvlink_bytes"] = m.nvlink_bytes;
    metrics["network_bytes"] = m.network_bytes;
    metrics["dispatch_nvlink_bytes"] = m.dispatch_nvlink_bytes;
    metrics["dispatch_network_bytes"] = m.dispatch_network_bytes;
    metrics["fits_static_window"] = m.fits_static_window;
    metrics["window_slack_ms"] = m.window_slack_ms;
    metrics["copy_exposed_ms"] = m.copy_exposed_ms;
    metrics["planner_us"] = m.planner_us;

    py::dict out;
    out["slice_expert"] = to_numpy(expert);
    out["slice_home"] = to_numpy(home);
    out["slice_gpu"] = to_numpy(gpu);
    out["slice_rows"] = to_numpy(rows);
    out["slice_source"] = source;
    out["copy_kind"] = kind;
    out["copy_expert"] = to_numpy(c_expert);
    out["copy_src_gpu"] = to_numpy(c_src);
    out["copy_dst_gpu"] = to_numpy(c_dst);
    out["copy_rows"] = to_numpy(c_rows);
    out["copy_bytes"] = to_numpy(c_bytes);
    out["resident_expert"] = to_numpy(r_expert);
    out["resident_gpu"] = to_numpy(r_gpu);
    out["dynamic"] = to_numpy(plan.dynamic);
    out["weight_bytes"] = plan.weight_bytes();
    out["token_bytes"] = plan.token_bytes();
    out["home_rows"] = to_numpy(loads.home_rows);
    out["guest_rows"] = to_numpy(loads.guest_rows);
    out["gemm_ms"] = to_numpy(loads.gemm_ms);
    out["metrics"] = metrics;
    out["schedule"] = schedule_to_python(plan.schedule);
    out["serialized"] = py::bytes(serialize(plan));
    return out;
  }

  // Plan::schedule as arrays: per copy, per GPU, per turn (with its GPU), per (sender, helper).
  py::dict schedule_to_python(const Schedule& s) const {
    const int R = topo_.num_ranks();
    std::vector<double> start, end;
    std::vector<uint8_t> timed;
    for (const CopyTime& c : s.copies) {
      start.push_back(c.start_ms);
      end.push_back(c.end_ms);
      timed.push_back(c.timed);
    }
    std::vector<int64_t> turn_gpu, owner, helper_gpu, helper;
    std::vector<double> lands, gemm, wait;
    for (int g = 0; g < R; ++g) {
      for (const OwnerTurn& t : s.turns_of(g)) {
        turn_gpu.push_back(g);
        owner.push_back(t.owner);
        lands.push_back(t.lands_ms);
        gemm.push_back(t.gemm_ms);
        wait.push_back(t.wait_ms);
      }
      for (int h : s.helpers_of(g)) {
        helper_gpu.push_back(g);
        helper.push_back(h);
      }
    }
    py::dict d;
    d["copy_start_ms"] = s.copy_start_ms;
    d["copy_start"] = to_numpy(start);
    d["copy_end"] = to_numpy(end);
    d["copy_timed"] = to_numpy(timed);
    d["own_ms"] = to_numpy(s.own_ms);
    d["prefetch_ms"] = to_numpy(s.prefetch_ms);
    d["ready_ms"] = to_numpy(s.ready_ms);
    d["turn_gpu"] = to_numpy(turn_gpu);
    d["turn_owner"] = to_numpy(owner);
    d["turn_lands_ms"] = to_numpy(lands);
    d["turn_gemm_ms"] = to_numpy(gemm);
    d["turn_wait_ms"] = to_numpy(wait);
    d["helper_gpu"] = to_numpy(helper_gpu);
    d["helper"] = to_numpy(helper);
    return d;
  }

  Topology topo_;
  ExpertShape shape_;
  Knobs knobs_;
  CostChoice cost_;  // owns the cost model the planner points to
  std::unique_ptr<Planner> planner_;
  RoutingStep step_;
  int64_t steps_ = 0;  // steps planned or observed: the step ids the planner sees
};

}  // namespace

void bind_plan(py::module_& m) {
  py::class_<PyPlanner>(m, "Planner")
      .def(py::init<const std::string&, const Topology&, const ExpertShape&, const py::dict&,
                    const std::string&, const std::string&,
                    const std::optional<std::vector<int64_t>>&>(),
           py::arg("policy"), py::arg("topology"), py::arg("shape"), py::arg("knobs"),
           py::arg("cost_model"), py::arg("data_dir"), py::arg("dynamic"))
      .def("plan", &PyPlanner::plan, py::arg("counts"), py::arg("layer"), py::arg("observe"))
      .def("observe", &PyPlanner::observe, py::arg("counts"), py::arg("layer"))
      .def_property_readonly("policy", [](const PyPlanner& p) { return std::string(p.policy()); })
      .def_property_readonly("topology", &PyPlanner::topology)
      .def_property_readonly("shape", &PyPlanner::shape)
      .def_property_readonly("cost_model", &PyPlanner::cost_label);
}

}  // namespace feplb::python
