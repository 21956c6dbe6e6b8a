// feplb simulate: every policy over a routing trace, no GPU needed.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli.h"
#include "feplb/core/error.h"
#include "feplb/core/file_io.h"
#include "feplb/core/placement.h"
#include "feplb/core/planners/planner.h"
#include "feplb/core/trace_io.h"
#include "feplb/sim/report.h"
#include "feplb/sim/simulate.h"

namespace feplb::cli {
namespace {

struct SimulateOptions {
  std::string trace;
  int gpus_per_node = 8;
  int64_t warmup = 0;
  std::string placement, save_placement;
  int64_t walk_forward = 0, window = 0;
  std::string policies = "static,feplb-paper,feplb,fastermoe,oracle";
  std::string json_out, plot_out;
  bool force = false, quiet = false;
  std::string cost_model = "auto";
  std::string gpu;
  const GpuClass* gpu_class = nullptr;  // from --gpu, applied to `knobs`
  ShapeFlags shape;
  Knobs knobs;
};

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) {
    FEPLB_REQUIRE_INPUT(!item.empty(), "--policies: empty name in '{}'", s);
    out.push_back(item);
  }
  return out;
}

// Refuses an output path that would overwrite the input trace, whatever --force says.
void check_output(const std::string& out, const std::string& input) {
  if (out.empty()) return;
  std::error_code ec;
  FEPLB_REQUIRE_INPUT(!std::filesystem::equivalent(out, input, ec), "{}: is the input trace", out);
}

void run_simulate(const SimulateOptions& o) {
  const std::string path = o.trace.empty() ? default_trace_path() : o.trace;
  FEPLB_REQUIRE_INPUT(o.gpus_per_node >= 1, "--gpus-per-node: {} must be at least 1",
                      o.gpus_per_node);
  check_output(o.json_out, path);
  check_output(o.plot_out, path);
  check_output(o.save_placement, path);
  FEPLB_REQUIRE_INPUT(o.json_out.empty() || o.json_out != o.plot_out,
                      "--json and --plot name the same file");
  for (const std::string* out : {&o.json_out, &o.plot_out, &o.save_placement}) {
    std::error_code ec;
    FEPLB_REQUIRE_INPUT(
        out->empty() || o.placement.empty() || !std::filesystem::equivalent(*out, o.placement, ec),
        "{}: is the --placement file", *out);
  }
  FEPLB_REQUIRE_INPUT(o.window == 0 || o.walk_forward > 0, "--window: only with --walk-forward");
  // Unknown policies fail before the trace is read.
  std::vector<std::string> policies = split_list(o.policies);
  for (const std::string& p : policies) {
    bool known = false;
    for (const std::string& n : planner_names()) known |= n == p;
    FEPLB_REQUIRE_INPUT(known, "--policies: unknown policy '{}' (known: {})", p,
                        fmt::join(planner_names(), ", "));
  }
  validate_knobs(o.knobs);
  for (const std::string* out : {&o.json_out, &o.plot_out, &o.save_placement}) {
    std::error_code ec;
    FEPLB_REQUIRE_INPUT(out->empty() || o.force || !std::filesystem::exists(*out, ec),
                        "{}: exists; pass --force to overwrite", *out);
  }

  const Trace trace = read_trace(path);
  FEPLB_REQUIRE_INPUT(trace.num_ranks <= o.gpus_per_node || trace.num_ranks % o.gpus_per_node == 0,
                      "--gpus-per-node: {} does not divide the trace's num_ranks {}",
                      o.gpus_per_node, trace.num_ranks);
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
  FEPLB_REQUIRE_INPUT(o.save_placement.empty() || !cfg.placement.empty() || o.walk_forward > 0,
                      "--save-placement: needs --placement or --walk-forward");
  cfg.shape = resolve_shape(o.shape, &trace, trace.model);
  cfg.knobs = o.knobs;
  cfg.trace_label = path;
  cfg.gpu = std::string(o.gpu_class->name);
  const CostChoice cost = resolve_cost(o.cost_model, cfg.shape, o.knobs, *o.gpu_class);
  cfg.cost = cost.model.get();
  cfg.cost_label = cost.label;
  ProgressLine progress("simulate", !o.quiet);
  const SimulationResult result = simulate(trace, cfg, std::ref(progress));
  std::fputs(format_table(result).c_str(), stdout);
  if (!o.json_out.empty()) {
    write_file(o.json_out, format_json(result), o.force);
    std::printf("wrote %s\n", o.json_out.c_str());
  }
  if (!o.plot_out.empty()) {
    write_file(o.plot_out, plot_svg(result), o.force);
    std::printf("wrote %s\n", o.plot_out.c_str());
  }
  if (!o.save_placement.empty()) {
    const std::string history = fmt::format(
        R"({{"tool":"feplb simulate","trace":{},"walk_forward":{},"window":{},"replans":{}}})",
        nlohmann::json(path).dump(), o.walk_forward, o.window > 0 ? o.window : o.walk_forward,
        result.replans.size());
    write_file(o.save_placement, format_placement(result.final_placement, history), o.force);
    std::printf("wrote %s\n", o.save_placement.c_str());
  }
}

}  // namespace

void add_simulate_command(CLI::App& app) {
  auto o = std::make_shared<SimulateOptions>();
  CLI::App* cmd = app.add_subcommand(
      "simulate", "Plan every step of a routing trace with each policy and compare them (no GPU)");
  cmd->add_option("--trace", o->trace, "feplb-trace-v1 file (default: data/traces/default.json)");
  cmd->add_option("--gpus-per-node,--domain-size", o->gpus_per_node,
                  "GPUs per NVLink domain: 8 for an HGX node, up to 72 for an NVL72 rack; EP "
                  "larger than this spans several domains joined by the network (default 8)");
  cmd->add_option(
      "--warmup", o->warmup,
      "the trace's first N micro-batches are history: observed by every planner, not measured "
      "(default 0)");
  cmd->add_option(
      "--policies", o->policies,
      "comma-separated policies (default static,feplb-paper,feplb,fastermoe,oracle; also "
      "eplb, llep, moonep)");
  cmd->add_option("--placement", o->placement,
                  "homes and dynamic sets per layer (feplb-placement-v1, from `feplb place`) for "
                  "every policy (default: contiguous homes)");
  cmd->add_option("--walk-forward", o->walk_forward,
                  "replan the placement every N micro-batches (from the end of --warmup) from the "
                  "previous --window micro-batches only, charging the migration (default 0: off)");
  cmd->add_option("--window", o->window,
                  "--walk-forward: micro-batches of history per replan (default: N)");
  cmd->add_option("--save-placement", o->save_placement,
                  "write the placement in force at the end (with --placement or --walk-forward)");
  cmd->add_option("--json", o->json_out, "write the results as JSON to this file");
  cmd->add_option("--plot", o->plot_out, "write an SVG of per-GPU load before/after each policy");
  cmd->add_flag("--force", o->force, "overwrite existing output files");
  cmd->add_flag("--quiet", o->quiet, "no progress lines on stderr");
  add_gpu_flag(*cmd, o->gpu);
  add_cost_flag(*cmd, o->cost_model);
  add_shape_flags(*cmd, o->shape);
  add_knob_flags(*cmd, o->knobs);
  cmd->callback([o, cmd] {
    o->gpu_class = &apply_gpu_flag(*cmd, o->gpu, o->knobs);
    run_simulate(*o);
  });
}

}  // namespace feplb::cli
