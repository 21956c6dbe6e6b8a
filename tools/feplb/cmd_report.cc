// feplb report: the balance sweep behind docs/results/core.md (priors x EP sizes x policies), with
// --anchors the anchors side by side behind docs/results/balance.md (plus SVG plots), and with
// --placement the macro timescale behind docs/results/placement.md.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <memory>
#include <sstream>

#include "cli.h"
#include "feplb/core/error.h"
#include "feplb/core/file_io.h"
#include "feplb/core/planners/planner.h"
#include "feplb/sim/balance.h"
#include "feplb/sim/placement_report.h"
#include "feplb/sim/sweep.h"

namespace feplb::cli {
namespace {

constexpr const char* kCorePolicies = "static,feplb-paper,feplb,fastermoe,oracle";
constexpr int64_t kUnset = std::numeric_limits<int64_t>::min();

struct ReportOptions {
  std::string priors_dir, out_md, out_json, plots_dir;
  std::string ranks;     // default: 2,4,8 (core) or 2,4,8,16 (--anchors)
  std::string policies;  // default: the five core ones, or every planner (--anchors)
  std::string skews = "1.2,2,5,10";
  int64_t warmup = kUnset;  // default: 0 (core) or 16 (--anchors)
  bool anchors = false;
  bool placement = false;
  bool steps_given = false;
  bool placement_flags_given = false;  // --walk-forward, --window or --timing-steps
  int64_t walk_forward = 32, window = 32, timing_steps = 1000;
  SweepConfig sweep;
  ShapeFlags shape;
  bool force = false, quiet = false;
  std::string cost_model = "auto";
};

// The Markdown to --md (or stdout) and, when --json is given, the JSON made by `json`.
template <typename MakeJson>
void write_outputs(const ReportOptions& o, const std::string& md, const MakeJson& json) {
  if (!o.out_md.empty()) {
    write_file(o.out_md, md, o.force);
    std::printf("wrote %s\n", o.out_md.c_str());
  } else {
    std::fputs(md.c_str(), stdout);
  }
  if (!o.out_json.empty()) {
    write_file(o.out_json, json(), o.force);
    std::printf("wrote %s\n", o.out_json.c_str());
  }
}

template <typename T>
std::vector<T> parse_list(const std::string& s, const char* flag) {
  std::vector<T> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) {
    FEPLB_REQUIRE_INPUT(!item.empty(), "{}: empty item in '{}'", flag, s);
    if constexpr (std::is_same_v<T, int>) {
      size_t used = 0;
      int v = 0;
      try {
        v = std::stoi(item, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      FEPLB_REQUIRE_INPUT(used == item.size() && v >= 1, "{}: '{}' is not a positive integer", flag,
                          item);
      out.push_back(v);
    } else if constexpr (std::is_same_v<T, double>) {
      size_t used = 0;
      double v = 0;
      try {
        v = std::stod(item, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      FEPLB_REQUIRE_INPUT(used == item.size() && v >= 1, "{}: '{}' is not a number >= 1", flag,
                          item);
      out.push_back(v);
    } else {
      out.push_back(item);
    }
  }
  return out;
}

// --anchors: every policy (and the Pareto variants) on real priors and lognormal skew levels;
// Markdown, JSON and SVG plots (balance-*.svg in --plots).
void run_anchors(const ReportOptions& o, const std::string& command) {
  namespace fs = std::filesystem;
  std::error_code ec;
  BalanceConfig c;
  c.prior_paths = o.sweep.prior_paths;
  c.ranks = o.sweep.ranks;
  c.skews = o.skews == "none" ? std::vector<double>{} : parse_list<double>(o.skews, "--skews");
  for (double skew : c.skews) {
    FEPLB_REQUIRE_INPUT(skew < o.sweep.num_experts, "--skews: {} must be below the expert count {}",
                        skew, o.sweep.num_experts);
  }
  c.num_experts = o.sweep.num_experts;
  c.top_k = o.sweep.top_k;
  c.gpus_per_node = o.sweep.gpus_per_node;
  c.workload = o.sweep.workload;
  c.warmup_steps = o.warmup;
  c.sim = o.sweep.sim;
  c.model = o.sweep.model;
  if (o.cost_model != "roofline") c.cost_dir = data_path("cost");
  if (!o.plots_dir.empty()) {
    FEPLB_REQUIRE_INPUT(fs::is_directory(o.plots_dir, ec), "--plots: {} is not a directory",
                        o.plots_dir);
    for (const char* name :
         {"balance-token-straggler.svg", "balance-gemm-straggler.svg", "balance-weight-bytes.svg",
          "balance-pareto.svg", "balance-cross-node.svg"}) {
      const std::string path = (fs::path(o.plots_dir) / name).string();
      FEPLB_REQUIRE_INPUT(o.force || !fs::exists(path, ec), "{}: exists; pass --force to overwrite",
                          path);
    }
  }
  ProgressLine progress("report", !o.quiet);
  const BalanceResult r = run_balance(c, std::ref(progress));
  std::string plot_dir;
  if (!o.plots_dir.empty()) {
    const fs::path md_dir =
        o.out_md.empty() ? fs::current_path() : fs::absolute(o.out_md).parent_path();
    plot_dir = fs::relative(fs::absolute(o.plots_dir), md_dir, ec).string();
    if (plot_dir == ".") plot_dir.clear();
  }
  const std::string md =
      format_balance_markdown(r, command, plot_dir.empty() ? "" : plot_dir + "/");
  write_outputs(o, md, [&] { return format_balance_json(r, command); });
  if (!o.plots_dir.empty()) {
    for (const auto& [name, svg] : balance_plots(r)) {
      const std::string path = (fs::path(o.plots_dir) / name).string();
      write_file(path, svg, o.force);
      std::printf("wrote %s\n", path.c_str());
    }
  }
}

// --placement: the macro timescale (docs/results/placement.md): walk-forward placement on real
// priors at EP=16 and EP=8, and the placer's timing.
void run_placement(const ReportOptions& o, const std::string& command) {
  PlacementReportConfig c;
  c.prior_paths = o.sweep.prior_paths;
  c.num_experts = o.sweep.num_experts;
  c.top_k = o.sweep.top_k;
  c.gpus_per_node = o.sweep.gpus_per_node;
  c.workload = o.sweep.workload;
  if (!o.steps_given) c.workload.num_steps = 96;
  c.warmup_steps = o.warmup;
  c.replan_interval = o.walk_forward;
  c.replan_window = o.window;
  c.timing_steps = o.timing_steps;
  c.sim = o.sweep.sim;
  c.model = o.sweep.model;
  ProgressLine progress("report", !o.quiet);
  const PlacementReportResult r = run_placement_report(c, std::ref(progress));
  const std::string md = format_placement_markdown(r, command);
  write_outputs(o, md, [&] { return format_placement_json(r, command); });
}

// The options given on the command line (without --quiet and --force, which change no number),
// for the provenance line of the --anchors report.
std::string given_command(const CLI::App& cmd) {
  std::string out = "feplb report";
  for (const CLI::Option* opt : cmd.get_options()) {
    const std::string name = opt->get_name();
    if (opt->count() == 0 || name == "--help" || name == "--quiet" || name == "--force") continue;
    out += " " + name;
    if (opt->get_expected_min() == 0) continue;  // a flag
    for (const std::string& v : opt->results()) out += " " + v;
  }
  return out;
}

void run_report(ReportOptions o, const std::string& command) {
  namespace fs = std::filesystem;
  const std::string dir = o.priors_dir.empty() ? data_path("priors") : o.priors_dir;
  std::error_code ec;
  FEPLB_REQUIRE_INPUT(fs::is_directory(dir, ec), "--priors: {} is not a directory", dir);
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() == ".json") o.sweep.prior_paths.push_back(entry.path().string());
  }
  std::sort(o.sweep.prior_paths.begin(), o.sweep.prior_paths.end());
  FEPLB_REQUIRE_INPUT(!(o.anchors && o.placement), "--placement: not with --anchors");
  FEPLB_REQUIRE_INPUT(!o.placement || (o.ranks.empty() && o.policies.empty()),
                      "--placement: its EP sizes and policies are fixed; drop --ranks/--policies");
  if (o.ranks.empty()) o.ranks = o.anchors ? "2,4,8,16" : "2,4,8";
  if (o.policies.empty()) {
    o.policies = o.anchors ? fmt::format("{}", fmt::join(planner_names(), ",")) : kCorePolicies;
  }
  FEPLB_REQUIRE_INPUT(o.placement || !o.placement_flags_given,
                      "--walk-forward/--window/--timing-steps: only with --placement");
  FEPLB_REQUIRE_INPUT(o.window >= 1, "--window: {} must be at least 1", o.window);
  if (o.warmup == kUnset) o.warmup = o.anchors ? 16 : o.placement ? 32 : 0;
  FEPLB_REQUIRE_INPUT(o.warmup >= 0, "--warmup: {} must be at least 0", o.warmup);
  FEPLB_REQUIRE_INPUT(o.plots_dir.empty() || o.anchors, "--plots: only with --anchors");
  o.sweep.ranks = parse_list<int>(o.ranks, "--ranks");
  o.sweep.sim.policies = parse_list<std::string>(o.policies, "--policies");
  for (const std::string& p : o.sweep.sim.policies) {
    FEPLB_REQUIRE_INPUT(
        std::find(planner_names().begin(), planner_names().end(), p) != planner_names().end(),
        "--policies: unknown policy '{}' (known: {})", p, fmt::join(planner_names(), ", "));
  }
  o.sweep.sim.warmup_steps = o.warmup;
  o.sweep.sim.shape = resolve_shape(o.shape, nullptr, o.sweep.model);
  validate_knobs(o.sweep.sim.knobs);
  const CostChoice cost = resolve_cost(o.cost_model, o.sweep.sim.shape, o.sweep.sim.knobs);
  o.sweep.sim.cost = cost.model.get();
  o.sweep.sim.cost_label = cost.label;
  for (const std::string* out : {&o.out_md, &o.out_json}) {
    FEPLB_REQUIRE_INPUT(out->empty() || o.force || !fs::exists(*out, ec),
                        "{}: exists; pass --force to overwrite", *out);
  }
  if (o.anchors) {
    run_anchors(o, command);
    return;
  }
  if (o.placement) {
    run_placement(o, command);
    return;
  }
  ProgressLine progress("report", !o.quiet);
  const SweepResult r = run_sweep(o.sweep, std::ref(progress));
  const std::string md = format_sweep_markdown(r, command);
  write_outputs(o, md, [&] { return format_sweep_json(r, command); });
}

}  // namespace

void add_report_command(CLI::App& app) {
  auto o = std::make_shared<ReportOptions>();
  o->sweep.workload.num_steps = 16;
  CLI::App* cmd = app.add_subcommand(
      "report",
      "Sweep every prior file x EP size x policy and write a Markdown/JSON report (no GPU)");
  cmd->add_option("--priors", o->priors_dir, "directory of prior files (default data/priors)");
  cmd->add_flag(
      "--anchors", o->anchors,
      "the anchors side by side (docs/results/balance.md): every policy on real priors and "
      "lognormal skews, Pareto variants, placed homes; with --plots, SVGs");
  cmd->add_flag("--placement", o->placement,
                "the macro timescale (docs/results/placement.md): walk-forward expert placement "
                "on real priors at EP=16 (2 nodes) and EP=8, and the placer's timing");
  cmd->add_option("--walk-forward", o->walk_forward,
                  "--placement: replan every N micro-batches (default 32)");
  cmd->add_option("--window", o->window,
                  "--placement: micro-batches of history per replan (default 32)");
  cmd->add_option("--timing-steps", o->timing_steps,
                  "--placement: micro-batches of history the placer is timed on (default 1000)");
  cmd->add_option("--ranks", o->ranks,
                  "comma-separated EP sizes (default 2,4,8; --anchors: 2,4,8,16)");
  cmd->add_option(
      "--policies", o->policies,
      "comma-separated policies (default: the five core ones; --anchors: every planner)");
  cmd->add_option(
      "--skews", o->skews,
      "--anchors: lognormal max/mean over experts, comma-separated, or none (default 1.2,2,5,10)");
  cmd->add_option(
      "--warmup", o->warmup,
      "micro-batches of history observed before the measured ones (default 0; --anchors: 16; "
      "--placement: 32)");
  cmd->add_option("--plots", o->plots_dir,
                  "--anchors: write the balance-*.svg plots into this directory");
  cmd->add_option("--experts", o->sweep.num_experts,
                  "experts; priors are widened to it (default 128)");
  cmd->add_option("--top-k", o->sweep.top_k, "experts per token (default 8)");
  cmd->add_option("--gpus-per-node", o->sweep.gpus_per_node, "GPUs per NVLink domain (default 8)");
  cmd->add_option("--tokens-per-rank", o->sweep.workload.tokens_per_rank,
                  "tokens per GPU (default 4096)");
  cmd->add_option("--steps", o->sweep.workload.num_steps,
                  "measured micro-batches per prior (default 16; --placement: 96)");
  cmd->add_option("--seq-len", o->sweep.workload.seq_len, "tokens per sequence (default 4096)");
  cmd->add_option("--concentration", o->sweep.workload.concentration,
                  "Dirichlet concentration (default 2000)");
  cmd->add_option("--seed", o->sweep.workload.seed, "random seed (default 1)");
  cmd->add_option("--model", o->sweep.model,
                  "model name, sets the expert shape (default glm5-128e)");
  cmd->add_option("--md", o->out_md, "write the Markdown report here (default: stdout)");
  cmd->add_option("--json", o->out_json, "write the JSON results here");
  cmd->add_flag("--force", o->force, "overwrite existing output files");
  cmd->add_flag("--quiet", o->quiet, "no progress lines on stderr");
  add_cost_flag(*cmd, o->cost_model);
  add_shape_flags(*cmd, o->shape);
  add_knob_flags(*cmd, o->sweep.sim.knobs);
  cmd->callback([o, cmd] {
    std::string command = "feplb report";
    o->steps_given = cmd->count("--steps") > 0;
    o->placement_flags_given =
        cmd->count("--walk-forward") + cmd->count("--window") + cmd->count("--timing-steps") > 0;
    if (o->anchors || o->placement) {
      command = given_command(*cmd);
    } else {
      for (const std::string& a : cmd->remaining()) command += " " + a;
    }
    run_report(*o, command);
  });
}

}  // namespace feplb::cli
