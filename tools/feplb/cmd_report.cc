// feplb report: the balance sweep behind docs/results/core.md (priors x EP sizes x policies).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <sstream>

#include "cli.h"
#include "feplb/core/error.h"
#include "feplb/core/file_io.h"
#include "feplb/core/planners/planner.h"
#include "feplb/core/sweep.h"

namespace feplb::cli {
namespace {

struct ReportOptions {
  std::string priors_dir, out_md, out_json;
  std::string ranks = "2,4,8";
  std::string policies = "static,feplb-paper,feplb,fastermoe,oracle";
  SweepConfig sweep;
  ShapeFlags shape;
  bool force = false, quiet = false;
};

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
      FEPLB_REQUIRE_INPUT(used == item.size() && v >= 1, "{}: '{}' is not a positive integer", flag, item);
      out.push_back(v);
    } else {
      out.push_back(item);
    }
  }
  return out;
}

void run_report(ReportOptions o, const std::string& command) {
  namespace fs = std::filesystem;
  const std::string dir = o.priors_dir.empty() ? data_dir() + "/priors" : o.priors_dir;
  std::error_code ec;
  FEPLB_REQUIRE_INPUT(fs::is_directory(dir, ec), "--priors: {} is not a directory", dir);
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() == ".json") o.sweep.prior_paths.push_back(entry.path().string());
  }
  std::sort(o.sweep.prior_paths.begin(), o.sweep.prior_paths.end());
  o.sweep.ranks = parse_list<int>(o.ranks, "--ranks");
  o.sweep.sim.policies = parse_list<std::string>(o.policies, "--policies");
  for (const std::string& p : o.sweep.sim.policies) {
    FEPLB_REQUIRE_INPUT(std::find(planner_names().begin(), planner_names().end(), p) != planner_names().end(),
                        "--policies: unknown policy '{}' (known: {})", p, fmt::join(planner_names(), ", "));
  }
  o.sweep.sim.shape = resolve_shape(o.shape, nullptr, o.sweep.model);
  validate_knobs(o.sweep.sim.knobs);
  for (const std::string* out : {&o.out_md, &o.out_json}) {
    FEPLB_REQUIRE_INPUT(out->empty() || o.force || !fs::exists(*out, ec), "{}: exists; pass --force to overwrite",
                        *out);
  }
  ProgressLine progress("report", !o.quiet);
  const SweepResult r = run_sweep(o.sweep, std::ref(progress));
  const std::string md = format_sweep_markdown(r, command);
  if (!o.out_md.empty()) {
    write_file(o.out_md, md, o.force);
    std::printf("wrote %s\n", o.out_md.c_str());
  } else {
    std::fputs(md.c_str(), stdout);
  }
  if (!o.out_json.empty()) {
    write_file(o.out_json, format_sweep_json(r, command), o.force);
    std::printf("wrote %s\n", o.out_json.c_str());
  }
}

}  // namespace

void add_report_command(CLI::App& app) {
  auto o = std::make_shared<ReportOptions>();
  o->sweep.workload.num_steps = 16;
  CLI::App* cmd = app.add_subcommand(
      "report", "Sweep every prior file x EP size x policy and write a Markdown/JSON report (no GPU)");
  cmd->add_option("--priors", o->priors_dir, "directory of prior files (default data/priors)");
  cmd->add_option("--ranks", o->ranks, "comma-separated EP sizes (default 2,4,8)");
  cmd->add_option("--policies", o->policies, "comma-separated policies (default: the five core ones)");
  cmd->add_option("--experts", o->sweep.num_experts, "experts; priors are widened to it (default 128)");
  cmd->add_option("--top-k", o->sweep.top_k, "experts per token (default 8)");
  cmd->add_option("--gpus-per-node", o->sweep.gpus_per_node, "GPUs per NVLink domain (default 8)");
  cmd->add_option("--tokens-per-rank", o->sweep.workload.tokens_per_rank, "tokens per GPU (default 4096)");
  cmd->add_option("--steps", o->sweep.workload.num_steps, "micro-batches per prior (default 16)");
  cmd->add_option("--seq-len", o->sweep.workload.seq_len, "tokens per sequence (default 4096)");
  cmd->add_option("--concentration", o->sweep.workload.concentration, "Dirichlet concentration (default 2000)");
  cmd->add_option("--seed", o->sweep.workload.seed, "random seed (default 1)");
  cmd->add_option("--model", o->sweep.model, "model name, sets the expert shape (default glm5-128e)");
  cmd->add_option("--md", o->out_md, "write the Markdown report here (default: stdout)");
  cmd->add_option("--json", o->out_json, "write the JSON results here");
  cmd->add_flag("--force", o->force, "overwrite existing output files");
  cmd->add_flag("--quiet", o->quiet, "no progress lines on stderr");
  add_shape_flags(*cmd, o->shape);
  add_knob_flags(*cmd, o->sweep.sim.knobs);
  cmd->callback([o, cmd] {
    std::string command = "feplb report";
    for (const std::string& a : cmd->remaining()) command += " " + a;
    run_report(*o, command);
  });
}

}  // namespace feplb::cli
