// simulate for Python: the simulator behind `feplb simulate`, configured from keyword arguments
// as the CLI configures it from flags, returning the JSON document `feplb simulate --json` writes
// (the Python layer turns it into dicts).
#include "feplb/sim/simulate.h"

#include <pybind11/stl.h>

#include "feplb/core/error.h"
#include "feplb/core/expert_shape.h"
#include "feplb/core/placement.h"
#include "feplb/sim/cost_choice.h"
#include "feplb/sim/report.h"
#include "python/src/bindings.h"

namespace feplb::python {
namespace {

std::string simulate_json(const PyTrace& t, const std::vector<std::string>& policies,
                          int gpus_per_node, int64_t warmup, const std::string& placement,
                          int64_t walk_forward, int64_t window, const std::string& cost_model,
                          const std::string& data_dir, int64_t hidden, int64_t ffn,
                          const std::string& dtype, const py::dict& knob_overrides,
                          const std::string& trace_label) {
  const Trace& trace = t.trace;
  FEPLB_REQUIRE_INPUT(gpus_per_node >= 1, "gpus_per_node: {} must be at least 1", gpus_per_node);
  FEPLB_REQUIRE_INPUT(window == 0 || walk_forward > 0, "window: only with walk_forward");
  FEPLB_REQUIRE_INPUT(hidden >= 0 && ffn >= 0, "hidden/ffn: must be positive");
  for (const std::string& p : policies) {
    bool known = false;
    for (const std::string& n : planner_names()) known |= n == p;
    FEPLB_REQUIRE_INPUT(known, "policies: unknown policy '{}' (known: {})", p,
                        fmt::join(planner_names(), ", "));
  }
  SimulationConfig cfg;
  cfg.knobs = knobs_from(knob_overrides);
  FEPLB_REQUIRE_INPUT(trace.num_ranks <= gpus_per_node || trace.num_ranks % gpus_per_node == 0,
                      "gpus_per_node: {} does not divide the trace's num_ranks {}", gpus_per_node,
                      trace.num_ranks);
  cfg.policies = policies;
  cfg.gpus_per_node = gpus_per_node;
  cfg.warmup_steps = warmup;
  if (!placement.empty()) {
    cfg.placement = read_placement(placement);
    try {
      check_placement_matches(cfg.placement, trace, gpus_per_node);
    } catch (const InputError& e) {
      throw InputError(fmt::format("{}: {}", placement, e.what()));
    }
  }
  cfg.replan_interval = walk_forward;
  cfg.replan_window = window;
  // The expert shape as the CLI resolves it: hidden/ffn/dtype > the trace's > the model preset's.
  if (trace.expert_shape) {
    cfg.shape = *trace.expert_shape;
  } else if (auto preset = shape_for_model(trace.model)) {
    cfg.shape = *preset;
  }
  if (hidden) cfg.shape.hidden = hidden;
  if (ffn) cfg.shape.ffn = ffn;
  if (!dtype.empty()) cfg.shape.dtype = parse_dtype(dtype, "dtype");
  FEPLB_REQUIRE_INPUT(cfg.shape.hidden > 0 && cfg.shape.ffn > 0,
                      "hidden/ffn: the expert shape is unknown for model '{}'; pass hidden= and "
                      "ffn=",
                      trace.model);
  cfg.trace_label = trace_label;
  const CostChoice cost =
      choose_cost_model(cost_model, cfg.shape, cfg.knobs, data_dir, "cost_model");
  cfg.cost = cost.model.get();
  cfg.cost_label = cost.label;
  std::string json;
  {
    py::gil_scoped_release release;
    json = format_json(simulate(trace, cfg));
  }
  return json;
}

}  // namespace

void bind_simulate(py::module_& m) {
  m.def("simulate_json", &simulate_json, py::arg("trace"), py::arg("policies"),
        py::arg("gpus_per_node"), py::arg("warmup"), py::arg("placement"), py::arg("walk_forward"),
        py::arg("window"), py::arg("cost_model"), py::arg("data_dir"), py::arg("hidden"),
        py::arg("ffn"), py::arg("dtype"), py::arg("knobs"), py::arg("trace_label"),
        "The JSON document `feplb simulate --json` writes for the same trace and options.");
}

}  // namespace feplb::python
