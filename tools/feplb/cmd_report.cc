// feplb report: the balance sweep behind docs/results/core.md (priors x EP sizes x policies), with
// --anchors the anchors side by side behind docs/results/balance.md (plus SVG plots), with
// --placement the macro timescale behind docs/results/placement.md, and with --rack rack-scale
// NVLink domains behind docs/results/rack.md (plus SVG plots).
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
#include "feplb/sim/modes.h"
#include "feplb/sim/placement_report.h"
#include "feplb/sim/rack.h"
#include "feplb/sim/sweep.h"

namespace feplb::cli {
namespace {

constexpr const char* kCorePolicies = "static,feplb-paper,feplb,fastermoe,oracle";
constexpr int64_t kUnset = std::numeric_limits<int64_t>::min();

struct ReportOptions : ModelFlags {
  std::string priors_dir, out_md, out_json, plots_dir;
  std::string ranks;        // default: 2,4,8 (core), 2,4,8,16 (--anchors), RackConfig's (--rack)
  std::string policies;     // default: the five core ones, or every planner (--anchors, --rack)
  std::string skews;        // default: 1.2,2,5,10 (--anchors), 5 (--rack)
  int64_t warmup = kUnset;  // default: 0 (core), 16 (--anchors), 32 (--placement), 8 (--rack)
  bool anchors = false;
  bool placement = false;
  bool rack = false;
  bool modes = false;
  std::string workloads;  // --modes: only the workloads whose "section: name" contains it
  int experts_per_gpu = 4;
  std::string compare_gpus;  // --rack: default every class
  bool steps_given = false;
  bool placement_flags_given = false;  // --walk-forward, --window or --timing-steps
  int64_t walk_forward = 32, window = 32, timing_steps = 1000;
  SweepConfig sweep;
  bool force = false, quiet = false;
  Knobs parsed_knobs;             // the knobs before --gpu was applied (--rack: every class)
  const CLI::App* cmd = nullptr;  // which flags were given
};

// Where the Markdown goes: --md, or standard output.
std::string md_target(const ReportOptions& o) { return o.out_md.empty() ? "-" : o.out_md; }

// Stages the Markdown for --md (or standard output) and, when --json is given, the JSON made by
// `json`; then every output is written together (FileSet::commit), or none.
template <typename MakeJson>
void write_outputs(const ReportOptions& o, FileSet& files, const std::string& md,
                   const MakeJson& json,
                   const std::vector<std::pair<std::string, std::string>>& plots = {}) {
  files.stage(md_target(o), md);
  if (!o.out_json.empty()) files.stage(o.out_json, json());
  if (!o.plots_dir.empty()) {
    for (const auto& [name, svg] : plots) {
      files.stage((std::filesystem::path(o.plots_dir) / name).string(), svg);
    }
  }
  for (const std::string& written : files.commit()) say_wrote(written);
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

// Where the plots are, relative to the Markdown file, ending in '/' ("./" in the Markdown's own
// directory; "" when --plots is not given).
std::string plot_link_dir(const ReportOptions& o) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (o.plots_dir.empty()) return "";
  const fs::path md_dir =
      o.out_md.empty() ? fs::current_path() : fs::absolute(o.out_md).parent_path();
  const std::string dir = fs::relative(fs::absolute(o.plots_dir), md_dir, ec).string();
  return dir == "." || dir.empty() ? "./" : dir + "/";
}

// --anchors: every policy (and the Pareto variants) on real priors and lognormal skew levels;
// Markdown, JSON and SVG plots (balance-*.svg in --plots).
void run_anchors(const ReportOptions& o, FileSet& files, const std::string& command) {
  namespace fs = std::filesystem;
  std::error_code ec;
  BalanceConfig c;
  c.prior_paths = o.sweep.prior_paths;
  c.ranks = o.sweep.ranks;
  const std::string skews = o.skews.empty() ? "1.2,2,5,10" : o.skews;
  c.skews = skews == "none" ? std::vector<double>{} : parse_list<double>(skews, "--skews");
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
  const std::string md = format_balance_markdown(r, command, plot_link_dir(o));
  write_outputs(
      o, files, md, [&] { return format_balance_json(r, command); }, balance_plots(r));
}

// --placement: the macro timescale (docs/results/placement.md): walk-forward placement on real
// priors at EP=16 and EP=8, and the placer's timing.
void run_placement(const ReportOptions& o, FileSet& files, const std::string& command) {
  PlacementReportConfig c;
  c.prior_paths = o.sweep.prior_paths;
  c.num_experts = o.sweep.num_experts;
  c.top_k = o.sweep.top_k;
  c.gpus_per_node = o.sweep.gpus_per_node;
  c.workload = o.sweep.workload;
  if (!o.steps_given) c.workload.num_steps = PlacementReportConfig{}.workload.num_steps;
  c.warmup_steps = o.warmup;
  c.replan_interval = o.walk_forward;
  c.replan_window = o.window;
  c.timing_steps = o.timing_steps;
  c.sim = o.sweep.sim;
  c.model = o.sweep.model;
  ProgressLine progress("report", !o.quiet);
  const PlacementReportResult r = run_placement_report(c, std::ref(progress));
  const std::string md = format_placement_markdown(r, command);
  write_outputs(o, files, md, [&] { return format_placement_json(r, command); });
}

// --rack: rack-scale NVLink domains (docs/results/rack.md): EP from one node to racks, few
// experts per GPU with hot experts, GPU classes side by side; Markdown, JSON and SVG plots.
void run_rack_report(const ReportOptions& o, FileSet& files, const std::string& command) {
  RackConfig c;
  if (!o.ranks.empty()) c.points = parse_rack_points(o.ranks, "--ranks");
  if (!o.skews.empty()) {
    const std::vector<double> skews = parse_list<double>(o.skews, "--skews");
    FEPLB_REQUIRE_INPUT(skews.size() == 1, "--skews: --rack takes one lognormal max/mean, not '{}'",
                        o.skews);
    c.skew = skews.front();
  }
  c.experts_per_gpu = o.experts_per_gpu;
  c.prior_paths = o.sweep.prior_paths;
  c.top_k = o.sweep.top_k;
  c.workload = o.sweep.workload;
  c.warmup_steps = o.warmup;
  c.sim = o.sweep.sim;
  c.model = o.sweep.model;
  // The GPU classes compared: each with its own knobs (the class, then the knob flags given) and
  // cost model, kept alive until the report is written.
  std::vector<std::string> names;
  if (o.compare_gpus.empty()) {
    for (const GpuClass& g : gpu_class_list()) names.emplace_back(g.name);
  } else if (o.compare_gpus != "none") {
    names = parse_list<std::string>(o.compare_gpus, "--compare-gpus");
  }
  std::vector<CostChoice> costs;
  costs.reserve(names.size());
  for (const std::string& name : names) {
    const auto& list = gpu_class_list();
    FEPLB_REQUIRE_INPUT(
        std::any_of(list.begin(), list.end(), [&](const GpuClass& g) { return g.name == name; }),
        "--compare-gpus: unknown GPU class '{}'", name);
    RackGpu g;
    g.name = name;
    g.knobs = o.parsed_knobs;
    const GpuClass& gc = apply_gpu_flag(*o.cmd, name, g.knobs);
    validate_knobs(g.knobs);
    costs.push_back(resolve_cost(o.cost_model, c.sim.shape, g.knobs, gc));
    g.cost = costs.back().model.get();
    g.cost_label = costs.back().label;
    c.gpus.push_back(std::move(g));
  }
  ProgressLine progress("report", !o.quiet);
  const RackResult r = run_rack(c, std::ref(progress));
  const std::string md = format_rack_markdown(r, command, plot_link_dir(o));
  write_outputs(
      o, files, md, [&] { return format_rack_json(r, command); }, rack_plots(r));
}

// --modes: feplb's default against every explicit mode and the anchors on every workload of the
// other reports (docs/results/modes.md); Markdown, JSON and one SVG plot.
void run_modes_report(const ReportOptions& o, FileSet& files, const std::string& command) {
  ModesConfig c;
  c.prior_paths = o.sweep.prior_paths;
  if (o.cost_model != "roofline") c.cost_dir = data_path("cost");
  c.workload = o.sweep.workload;
  c.sim = o.sweep.sim;
  c.only = o.workloads;
  ProgressLine progress("report", !o.quiet);
  const ModesResult r = run_modes(c, std::ref(progress));
  const std::string md = format_modes_markdown(r, command, plot_link_dir(o));
  write_outputs(
      o, files, md, [&] { return format_modes_json(r, command); }, modes_plots(r));
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

// The report's flags against each other, in the order the errors are reported, and the defaults
// that depend on the report asked for. `dir`: the priors' directory, whose files are listed.
void check_report_flags(ReportOptions& o, const std::string& dir) {
  namespace fs = std::filesystem;
  // A list flag given as '' is refused, not taken for its default.
  for (const auto& [flag, value] : {std::pair<const char*, const std::string*>{"--ranks", &o.ranks},
                                    {"--policies", &o.policies},
                                    {"--skews", &o.skews},
                                    {"--compare-gpus", &o.compare_gpus}}) {
    FEPLB_REQUIRE_INPUT(o.cmd->count(flag) == 0 || !value->empty(),
                        "{}: empty; give a comma-separated list (see --help)", flag);
  }
  std::error_code ec;
  FEPLB_REQUIRE_INPUT(fs::is_directory(dir, ec), "--priors: {} is not a directory", dir);
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() == ".json") o.sweep.prior_paths.push_back(entry.path().string());
  }
  std::sort(o.sweep.prior_paths.begin(), o.sweep.prior_paths.end());
  FEPLB_REQUIRE_INPUT(!(o.anchors && o.placement), "--placement: not with --anchors");
  FEPLB_REQUIRE_INPUT(!o.rack || !(o.anchors || o.placement), "--rack: not with --{}",
                      o.anchors ? "anchors" : "placement");
  FEPLB_REQUIRE_INPUT(!o.modes || !(o.anchors || o.placement || o.rack), "--modes: not with --{}",
                      o.anchors ? "anchors"
                      : o.rack  ? "rack"
                                : "placement");
  FEPLB_REQUIRE_INPUT(!o.modes || (o.ranks.empty() && o.policies.empty()),
                      "--modes: its workloads, EP sizes and policies are fixed; drop "
                      "--ranks/--policies (--workloads picks some of them)");
  FEPLB_REQUIRE_INPUT(o.modes || o.cmd->count("--workloads") == 0,
                      "--workloads: only with --modes");
  FEPLB_REQUIRE_INPUT(
      o.rack || (o.cmd->count("--experts-per-gpu") == 0 && o.cmd->count("--compare-gpus") == 0),
      "--experts-per-gpu/--compare-gpus: only with --rack");
  FEPLB_REQUIRE_INPUT(
      !o.rack || (o.cmd->count("--experts") == 0 && o.cmd->count("--gpus-per-node") == 0),
      "--experts/--gpus-per-node: not with --rack (its EP sizes name the NVLink "
      "domains, e.g. --ranks 8,72,4x72; experts: --experts-per-gpu)");
  FEPLB_REQUIRE_INPUT(o.skews.empty() || o.anchors || o.rack,
                      "--skews: only with --anchors or --rack");
  FEPLB_REQUIRE_INPUT(!o.placement || (o.ranks.empty() && o.policies.empty()),
                      "--placement: its EP sizes and policies are fixed; drop --ranks/--policies");
  if (o.ranks.empty() && !o.rack) o.ranks = o.anchors ? "2,4,8,16" : "2,4,8";
  if (o.policies.empty()) {
    o.policies =
        o.anchors || o.rack ? fmt::format("{}", fmt::join(planner_names(), ",")) : kCorePolicies;
  }
  FEPLB_REQUIRE_INPUT(o.placement || !o.placement_flags_given,
                      "--walk-forward/--window/--timing-steps: only with --placement");
  if (o.warmup == kUnset) {
    o.warmup = o.anchors     ? BalanceConfig{}.warmup_steps
               : o.placement ? PlacementReportConfig{}.warmup_steps
               : o.rack      ? RackConfig{}.warmup_steps
                             : 0;
  }
  if (o.rack && !o.steps_given) o.sweep.workload.num_steps = RackConfig{}.workload.num_steps;
  FEPLB_REQUIRE_INPUT(o.plots_dir.empty() || o.anchors || o.rack || o.modes,
                      "--plots: only with --anchors, --rack or --modes");
  FEPLB_REQUIRE_INPUT(o.plots_dir.empty() || fs::is_directory(o.plots_dir, ec),
                      "--plots: {} is not a directory", o.plots_dir);
}

// Every input (the priors, their directory, the cost table) and output, before any work.
void declare_report_files(const ReportOptions& o, const std::string& dir, FileSet& files) {
  namespace fs = std::filesystem;
  files.input_dir("the --priors directory", dir);
  for (const std::string& p : o.sweep.prior_paths) files.input("a prior file", p);
  files.input("the --cost-model table", cost_model_path(o.cost_model));
  files.output(o.out_md.empty() ? "the Markdown report (standard output without --md)" : "--md",
               md_target(o));
  files.output("--json", o.out_json);
  if ((o.anchors || o.rack || o.modes) && !o.plots_dir.empty()) {
    const std::vector<std::string> names = o.anchors ? balance_plot_names()
                                           : o.rack  ? rack_plot_names()
                                                     : std::vector<std::string>{"modes.svg"};
    for (const std::string& name : names) {
      files.output("--plots", (fs::path(o.plots_dir) / name).string());
    }
  }
}

void run_report(ReportOptions o, const std::string& command) {
  const std::string dir = o.priors_dir.empty() ? data_path("priors") : o.priors_dir;
  check_report_flags(o, dir);
  if (!o.rack) o.sweep.ranks = parse_list<int>(o.ranks, "--ranks");
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
  FileSet files(o.force);
  declare_report_files(o, dir, files);
  files.check();
  route_human_output(files);

  o.sweep.sim.gpu = std::string(o.gpu_class->name);
  const CostChoice cost =
      resolve_cost(o.cost_model, o.sweep.sim.shape, o.sweep.sim.knobs, *o.gpu_class);
  o.sweep.sim.cost = cost.model.get();
  o.sweep.sim.cost_label = cost.label;
  if (o.anchors) return run_anchors(o, files, command);
  if (o.rack) return run_rack_report(o, files, command);
  if (o.modes) return run_modes_report(o, files, command);
  if (o.placement) return run_placement(o, files, command);
  ProgressLine progress("report", !o.quiet);
  const SweepResult r = run_sweep(o.sweep, std::ref(progress));
  const std::string md = format_sweep_markdown(r, command);
  write_outputs(o, files, md, [&] { return format_sweep_json(r, command); });
}

// The reports besides the sweep (--anchors, --rack, --modes, --placement) and their own options.
void add_report_kinds(CLI::App& cmd, ReportOptions& o) {
  cmd.add_flag(
      "--anchors", o.anchors,
      "the anchors side by side (docs/results/balance.md): every policy on real priors and "
      "lognormal skews, Pareto variants, placed homes; with --plots, SVGs");
  cmd.add_flag("--rack", o.rack,
               "rack-scale NVLink domains (docs/results/rack.md): every policy from one 8-GPU "
               "node to domains of 72 and 256 GPUs and several racks, few experts per GPU with "
               "hot experts, GPU classes side by side; with --plots, SVGs");
  cmd.add_flag("--modes", o.modes,
               "feplb's default against every explicit mode and the anchors on every workload "
               "of the other reports (docs/results/modes.md); with --plots, an SVG");
  non_empty(
      cmd.add_option("--workloads", o.workloads,
                     "--modes: only the workloads whose 'section: name' contains this text (e.g. "
                     "'many-donor: generator' or 'EP=72')"));
  add_int(cmd, "--experts-per-gpu", o.experts_per_gpu, 1, limits::kMaxExperts,
          "--rack: experts per GPU of the EP sweep (default 4)");
  non_empty(
      cmd.add_option("--compare-gpus", o.compare_gpus,
                     "--rack: GPU classes compared at EP=72, comma-separated, or none (default: "
                     "every class)"));
  cmd.add_flag("--placement", o.placement,
               "the macro timescale (docs/results/placement.md): walk-forward expert placement "
               "on real priors at EP=16 (2 nodes) and EP=8, and the placer's timing");
  add_int(cmd, "--walk-forward", o.walk_forward, 1, limits::kMaxStepId,
          "--placement: replan every N micro-batches (default 32)");
  add_int(cmd, "--window", o.window, 1, limits::kMaxStepId,
          "--placement: micro-batches of history per replan (default 32)");
  add_int(cmd, "--timing-steps", o.timing_steps, 1, limits::kMaxStepId,
          "--placement: micro-batches of history the placer is timed on (default 1000)");
}

// The sweep's workloads, policies and model (the other reports take what applies to them), and
// where the plots go.
void add_sweep_options(CLI::App& cmd, ReportOptions& o) {
  cmd.add_option("--ranks", o.ranks,
                 fmt::format("comma-separated EP sizes (default 2,4,8; --anchors: 2,4,8,16; "
                             "--rack: {}, where R is one NVLink domain of R GPUs and NxD N "
                             "domains of D)",
                             format_rack_points(RackConfig{}.points)));
  add_policies(cmd, o.policies,
               "comma-separated policies (default: the five core ones; --anchors, --rack: every "
               "planner)");
  cmd.add_option("--skews", o.skews,
                 "--anchors: lognormal max/mean over experts, comma-separated, or none (default "
                 "1.2,2,5,10); --rack: one value (default 5)");
  add_int(cmd, "--warmup", o.warmup, 0, limits::kMaxStepId,
          fmt::format("micro-batches of history observed before the measured ones (default 0; "
                      "--anchors: {}; --placement: {}; --rack: {})",
                      BalanceConfig{}.warmup_steps, PlacementReportConfig{}.warmup_steps,
                      RackConfig{}.warmup_steps));
  non_empty(
      cmd.add_option("--plots", o.plots_dir,
                     "--anchors, --rack: write the balance-*.svg / rack-*.svg plots into this "
                     "directory"));
  add_int(cmd, "--experts", o.sweep.num_experts, 1, limits::kMaxExperts,
          "experts; priors are widened to it (default 128)");
  add_int(cmd, "--top-k", o.sweep.top_k, 1, limits::kMaxExperts, "experts per token (default 8)");
  add_int(cmd, "--tokens-per-rank", o.sweep.workload.tokens_per_rank, 0, int64_t{1} << 24,
          "tokens per GPU (default 4096)");
  add_int(cmd, "--steps", o.sweep.workload.num_steps, 1, limits::kMaxStepId,
          fmt::format("measured micro-batches per prior (default {}; --placement: {}; --rack: {})",
                      o.sweep.workload.num_steps, PlacementReportConfig{}.workload.num_steps,
                      RackConfig{}.workload.num_steps));
  add_int(cmd, "--seq-len", o.sweep.workload.seq_len, 1, int64_t{1} << 24,
          "tokens per sequence (default 4096)");
  add_real(cmd, "--concentration", o.sweep.workload.concentration, 0.0, 1e12,
           "Dirichlet concentration; 0: none (default 2000)");
  add_int(cmd, "--seed", o.sweep.workload.seed, "random seed (default 1)");
  add_model_flag(cmd, o.sweep.model, "model name (default glm5-128e)");
}

}  // namespace

void add_report_command(CLI::App& app) {
  auto o = std::make_shared<ReportOptions>();
  o->sweep.workload.num_steps = 16;
  CLI::App* cmd = app.add_subcommand(
      "report",
      "Sweep every prior file x EP size x policy and write a Markdown/JSON report (no GPU)");
  non_empty(
      cmd->add_option("--priors", o->priors_dir, "directory of prior files (default data/priors)"));
  add_report_kinds(*cmd, *o);
  add_sweep_options(*cmd, *o);
  non_empty(cmd->add_option("--md", o->out_md, "write the Markdown report here (default: stdout)"));
  non_empty(cmd->add_option("--json", o->out_json, "write the JSON results here (- for stdout)"));
  cmd->add_flag("--force", o->force, "overwrite existing output files");
  cmd->add_flag("--quiet", o->quiet, "no progress lines on stderr");
  add_model_flags(*cmd, *o);
  cmd->callback([o, cmd] {
    o->cmd = cmd;
    apply_knob_flags(*cmd, *o);
    o->parsed_knobs = o->knobs;
    o->gpu_class = &apply_gpu_flag(*cmd, o->gpu, o->knobs);
    std::string command = "feplb report";
    o->steps_given = cmd->count("--steps") > 0;
    o->placement_flags_given =
        cmd->count("--walk-forward") + cmd->count("--window") + cmd->count("--timing-steps") > 0;
    if (o->anchors || o->placement || o->rack || o->modes) {
      command = given_command(*cmd);
    } else {
      for (const std::string& a : cmd->remaining()) command += " " + a;
    }
    run_report(*o, command);
  });
}

}  // namespace feplb::cli
