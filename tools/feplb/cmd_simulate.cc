// feplb simulate: every policy over a routing trace, no GPU needed.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli.h"
#include "feplb/core/error.h"
#include "feplb/core/file_output.h"
#include "feplb/core/limits.h"
#include "feplb/core/placement.h"
#include "feplb/core/planners/planner.h"
#include "feplb/core/trace_io.h"
#include "feplb/sim/report.h"
#include "feplb/sim/simulate.h"

namespace feplb::cli {
namespace {

struct SimulateOptions : ModelFlags {
  std::string trace;
  int64_t warmup = 0;
  std::string placement, save_placement;
  int64_t walk_forward = 0, window = 0;  // window 0: not given (the walk-forward interval)
  std::string policies = "static,feplb-paper,feplb,fastermoe,oracle";
  std::string json_out, plot_out;
  bool force = false, quiet = false;
};

// The simulation of `trace` (read from `path`) as the options ask, but its cost model.
SimulationConfig simulation_config(const SimulateOptions& o, const Trace& trace,
                                   const std::string& path,
                                   const std::vector<std::string>& policies) {
  SimulationConfig cfg;
  cfg.policies = policies;
  cfg.gpus_per_node = o.gpus_per_node;
  cfg.warmup_steps = o.warmup;
  if (!o.placement.empty()) {
    cfg.placement = read_placement(o.placement);
    try {
      check_placement_matches(cfg.placement, trace, o.gpus_per_node);
    } catch (const InputError& e) {
      throw InputError(fmt::format("{}: {}", o.placement, e.what()));
    }
  }
  cfg.replan_interval = o.walk_forward;
  cfg.replan_window = o.window;
  cfg.shape = resolve_shape(o.shape, &trace, trace.model);
  cfg.knobs = o.knobs;
  cfg.trace_label = path;
  cfg.gpu = std::string(o.gpu_class->name);
  return cfg;
}

void run_simulate(const SimulateOptions& o) {
  const std::string path = o.trace.empty() ? default_trace_path() : o.trace;
  FEPLB_REQUIRE_INPUT(o.window == 0 || o.walk_forward > 0, "--window: only with --walk-forward");
  const std::vector<std::string> policies = split_policies(o.policies);
  validate_knobs(o.knobs);
  // EPLB replans after every eplb_interval micro-batches it has seen; a walk-forward epoch's
  // planner starts from the window alone, so a shorter window leaves it without a layout.
  const int64_t window = o.window > 0 ? o.window : o.walk_forward;
  FEPLB_REQUIRE_INPUT(
      o.walk_forward == 0 || window >= o.knobs.eplb_interval ||
          std::find(policies.begin(), policies.end(), "eplb") == policies.end(),
      "--window: eplb replans after every --eplb-interval {} micro-batches of history, but each "
      "walk-forward replan gives it only {}; it could not replan before its first micro-batches "
      "(use --window {} or more, or drop eplb)",
      o.knobs.eplb_interval, window, o.knobs.eplb_interval);
  FEPLB_REQUIRE_INPUT(o.save_placement.empty() || !o.placement.empty() || o.walk_forward > 0,
                      "--save-placement: needs --placement or --walk-forward");
  FileSet files(o.force);
  files.input("the input trace", path);
  files.input("the --placement file", o.placement);
  files.input("the --cost-model table", cost_model_path(o.cost_model));
  files.output("--json", o.json_out);
  files.output("--plot", o.plot_out);
  files.output("--save-placement", o.save_placement);
  files.check();
  route_human_output(files);

  const Trace trace = read_trace(path);
  FEPLB_REQUIRE_INPUT(trace.num_ranks <= o.gpus_per_node || trace.num_ranks % o.gpus_per_node == 0,
                      "--gpus-per-node: {} does not divide the trace's num_ranks {}",
                      o.gpus_per_node, trace.num_ranks);
  SimulationConfig cfg = simulation_config(o, trace, path, policies);
  const CostChoice cost = resolve_cost(o.cost_model, cfg.shape, o.knobs, *o.gpu_class);
  cfg.cost = cost.model.get();
  cfg.cost_label = cost.label;
  ProgressLine progress("simulate", !o.quiet);
  const SimulationResult result = simulate(trace, cfg, std::ref(progress));
  // Ranks with different token counts, or dropped rows: the table's means are of what was routed.
  if (!trace.uniform()) say_token_range(trace);
  std::fputs(format_table(result).c_str(), human_out());
  if (!o.json_out.empty()) files.stage(o.json_out, format_json(result));
  if (!o.plot_out.empty()) files.stage(o.plot_out, plot_svg(result));
  if (!o.save_placement.empty()) {
    const std::string history = fmt::format(
        R"({{"tool":"feplb simulate","trace":{},"walk_forward":{},"window":{},"replans":{}}})",
        nlohmann::json(path).dump(), o.walk_forward, window, result.replans.size());
    files.stage(o.save_placement, format_placement(result.final_placement, history));
  }
  for (const std::string& written : files.commit()) say_wrote(written);
}

}  // namespace

void add_simulate_command(CLI::App& app) {
  auto o = std::make_shared<SimulateOptions>();
  CLI::App* cmd = app.add_subcommand(
      "simulate", "Plan every step of a routing trace with each policy and compare them (no GPU)");
  non_empty(cmd->add_option(
      "--trace", o->trace,
      "feplb-trace-v1 file, - for standard input (default: data/traces/default.json)"));
  add_int(*cmd, "--warmup", o->warmup, 0, limits::kMaxStepId,
          "the trace's first N micro-batches are history: observed by every planner, not "
          "measured (default 0)");
  add_policies(*cmd, o->policies,
               "comma-separated policies (default static,feplb-paper,feplb,fastermoe,oracle)");
  non_empty(cmd->add_option(
      "--placement", o->placement,
      "homes and dynamic sets per layer (feplb-placement-v1, from `feplb place`) for "
      "every policy (default: contiguous homes)"));
  add_int(*cmd, "--walk-forward", o->walk_forward, 0, limits::kMaxStepId,
          "replan the placement every N micro-batches (from the end of --warmup) from the "
          "previous --window micro-batches only, charging the migration (default 0: off)");
  add_int(*cmd, "--window", o->window, 1, limits::kMaxStepId,
          "--walk-forward: micro-batches of history per replan (default: the --walk-forward "
          "interval)");
  non_empty(cmd->add_option(
      "--save-placement", o->save_placement,
      "write the placement in force at the end (with --placement or --walk-forward)"));
  non_empty(cmd->add_option("--json", o->json_out,
                            "write the results as JSON to this file (- for stdout)"));
  non_empty(
      cmd->add_option("--plot", o->plot_out,
                      "write an SVG of per-GPU load before/after each policy (- for stdout)"));
  cmd->add_flag("--force", o->force, "overwrite existing output files");
  cmd->add_flag("--quiet", o->quiet, "no progress lines on stderr");
  add_model_flags(*cmd, *o);
  cmd->callback([o, cmd] {
    apply_model_flags(*cmd, *o);
    run_simulate(*o);
  });
}

}  // namespace feplb::cli
