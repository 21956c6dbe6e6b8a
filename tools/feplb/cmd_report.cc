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
#include "feplb/core/file_output.h"
#include "feplb/core/limits.h"
#include "feplb/core/planners/planner.h"
#include "feplb/sim/balance.h"
#include "feplb/sim/placement_report.h"
#include "feplb/sim/sweep.h"

namespace feplb::cli {
namespace {

constexpr const char* kCorePolicies = "static,feplb-paper,feplb,fastermoe,oracle";
constexpr int64_t kUnset = std::numeric_limits<int64_t>::min();

struct ReportOptions : ModelFlags {
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
  bool force = false, quiet = false;
};

// The Markdown to --md (or stdout) and, when --json is given, the JSON made by `json`.
template <typename MakeJson>
void write_outputs(const ReportOptions& o, const std::string& md, const MakeJson& json) {
  if (!o.out_md.empty()) {
    write_file(o.out_md, md, o.force);
    say_wrote(o.out_md);
  } else {
    std::fputs(md.c_str(), stdout);
  }
  if (!o.out_json.empty()) {
    write_file(o.out_json, json(), o.force);
    say_wrote(o.out_json);
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
      say_wrote(path);
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
  if (o.warmup == kUnset) o.warmup = o.anchors ? 16 : o.placement ? 32 : 0;
  FEPLB_REQUIRE_INPUT(o.plots_dir.empty() || o.anchors, "--plots: only with --anchors");
  FEPLB_REQUIRE_INPUT(o.plots_dir.empty() || fs::is_directory(o.plots_dir, ec),
                      "--plots: {} is not a directory", o.plots_dir);
  o.sweep.ranks = parse_list<int>(o.ranks, "--ranks");
  for (int r : o.sweep.ranks) {
    FEPLB_REQUIRE_INPUT(r <= limits::kMaxRanks, "--ranks: {} is outside [1, {}]", r,
                        limits::kMaxRanks);
  }
  o.sweep.sim.policies = split_policies(o.policies);
  o.sweep.sim.warmup_steps = o.warmup;
  o.sweep.sim.knobs = o.knobs;
  o.sweep.gpus_per_node = o.gpus_per_node;
  o.sweep.sim.shape = resolve_shape(o.shape, nullptr, o.sweep.model);
  validate_knobs(o.sweep.sim.knobs);

  // Every input (the priors, their directory, the cost table) and output, before any work.
  FileSet files(o.force);
  files.input_dir("the --priors directory", dir);
  for (const std::string& p : o.sweep.prior_paths) files.input("a prior file", p);
  files.input("the --cost-model table", cost_model_path(o.cost_model));
  files.output("--md", o.out_md);
  files.output("--json", o.out_json);
  if (o.anchors && !o.plots_dir.empty()) {
    for (const std::string& name : balance_plot_names()) {
      files.output("--plots", (fs::path(o.plots_dir) / name).string());
    }
  }
  files.check();

  const CostChoice cost = resolve_cost(o.cost_model, o.sweep.sim.shape, o.sweep.sim.knobs);
  o.sweep.sim.cost = cost.model.get();
  o.sweep.sim.cost_label = cost.label;
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
  add_int(*cmd, "--walk-forward", o->walk_forward, 1, limits::kMaxStepId,
          "--placement: replan every N micro-batches (default 32)");
  add_int(*cmd, "--window", o->window, 1, limits::kMaxStepId,
          "--placement: micro-batches of history per replan (default 32)");
  add_int(*cmd, "--timing-steps", o->timing_steps, 1, limits::kMaxStepId,
          "--placement: micro-batches of history the placer is timed on (default 1000)");
  cmd->add_option("--ranks", o->ranks,
                  "comma-separated EP sizes (default 2,4,8; --anchors: 2,4,8,16)");
  add_policies(*cmd, o->policies,
               "comma-separated policies (default: the five core ones; --anchors: every planner)");
  cmd->add_option(
      "--skews", o->skews,
      "--anchors: lognormal max/mean over experts, comma-separated, or none (default 1.2,2,5,10)");
  add_int(*cmd, "--warmup", o->warmup, 0, limits::kMaxStepId,
          "micro-batches of history observed before the measured ones (default 0; --anchors: 16; "
          "--placement: 32)");
  cmd->add_option("--plots", o->plots_dir,
                  "--anchors: write the balance-*.svg plots into this directory");
  add_int(*cmd, "--experts", o->sweep.num_experts, 1, limits::kMaxExperts,
          "experts; priors are widened to it (default 128)");
  add_int(*cmd, "--top-k", o->sweep.top_k, 1, limits::kMaxExperts, "experts per token (default 8)");
  add_int(*cmd, "--tokens-per-rank", o->sweep.workload.tokens_per_rank, 0, int64_t{1} << 24,
          "tokens per GPU (default 4096)");
  add_int(*cmd, "--steps", o->sweep.workload.num_steps, 1, limits::kMaxStepId,
          "measured micro-batches per prior (default 16; --placement: 96)");
  add_int(*cmd, "--seq-len", o->sweep.workload.seq_len, 1, int64_t{1} << 24,
          "tokens per sequence (default 4096)");
  add_real(*cmd, "--concentration", o->sweep.workload.concentration, 0.0, 1e12,
           "Dirichlet concentration; 0: none (default 2000)");
  add_int(*cmd, "--seed", o->sweep.workload.seed, "random seed (default 1)");
  add_model_flag(*cmd, o->sweep.model, "model name (default glm5-128e)");
  cmd->add_option("--md", o->out_md, "write the Markdown report here (default: stdout)");
  cmd->add_option("--json", o->out_json, "write the JSON results here (- for stdout)");
  cmd->add_flag("--force", o->force, "overwrite existing output files");
  cmd->add_flag("--quiet", o->quiet, "no progress lines on stderr");
  add_model_flags(*cmd, *o);
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
