// feplb trace gen | info: make routing traces from expert-popularity priors, and describe them.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>

#include "cli.h"
#include "feplb/core/error.h"
#include "feplb/core/file_output.h"
#include "feplb/core/limits.h"
#include "feplb/core/metrics.h"
#include "feplb/core/stats.h"
#include "feplb/core/text.h"
#include "feplb/core/topology.h"
#include "feplb/core/trace_io.h"
#include "feplb/sim/prior.h"
#include "feplb/sim/workload.h"

namespace feplb::cli {
namespace {

struct GenOptions {
  std::string out, prior, model;
  double skew = 0;
  std::vector<double> hot_gpus;  // many-donor mode: loads of the hot GPUs of each domain
  double cold_min = 0.2;
  int gpus_per_node = 8;
  int layers = 1;
  int experts = 0, top_k = 0;  // 0: not given
  WorkloadSpec spec;
  ShapeFlags shape;
  bool force = false, quiet = false;
};

void run_gen(GenOptions o) {
  FEPLB_REQUIRE_INPUT(!o.out.empty(), "--out: required");
  FEPLB_REQUIRE_INPUT(o.hot_gpus.empty() ? o.prior.empty() != (o.skew == 0) : o.prior.empty(),
                      "give exactly one of --prior FILE, --skew X or --hot-gpus LOADS");
  FileSet files(o.force);
  files.input("the --prior file", o.prior);
  files.output("--out", o.out);
  files.check();
  route_human_output(files);
  Prior prior;
  if (!o.prior.empty()) {
    prior = read_prior(o.prior);
    if (o.experts) prior = expand_prior(prior, o.experts, o.spec.seed);
    if (!o.top_k) o.top_k = prior.top_k;
  } else if (!o.hot_gpus.empty()) {
    prior =
        many_donor_prior(o.experts ? o.experts : 128, o.spec.num_ranks, o.gpus_per_node, o.hot_gpus,
                         o.cold_min, o.skew == 0 ? 2.0 : o.skew, o.layers, o.spec.seed);
    if (!o.top_k) o.top_k = 8;
  } else {
    prior = lognormal_prior(o.experts ? o.experts : 128, o.skew, o.layers, o.spec.seed);
    if (!o.top_k) o.top_k = 8;
  }
  o.spec.top_k = o.top_k;
  ProgressLine progress("trace gen", !o.quiet);
  Trace t = generate_trace(prior, o.spec, std::ref(progress));
  if (!o.model.empty()) t.model = o.model;
  // Every generated trace carries its expert shape: the flags', the model's, else the default.
  ExpertShape shape = resolve_shape(o.shape, nullptr, t.model);
  const bool defaulted = shape.hidden == 0 || shape.ffn == 0;
  if (shape.hidden == 0) shape.hidden = default_shape().hidden;
  if (shape.ffn == 0) shape.ffn = default_shape().ffn;
  t.expert_shape = shape;
  files.stage(o.out, format_trace(t));
  files.commit();
  if (o.out == "-") return;
  std::fprintf(
      human_out(),
      "wrote %s: %zu steps (%lld micro-batches x %d layers), %d experts, top-%d, EP=%d, %lld "
      "tokens/rank, expert shape %s%s\n",
      printable(o.out).c_str(), t.steps.size(), static_cast<long long>(o.spec.num_steps),
      prior.num_layers(), t.num_experts, t.top_k, t.num_ranks,
      static_cast<long long>(t.tokens_per_rank), shape.describe().c_str(),
      defaulted ? " (the default; set it with --model or --hidden/--ffn)" : "");
}

void run_info(const std::string& path, int gpus_per_node) {
  const Trace t = read_trace(path);
  FEPLB_REQUIRE_INPUT(t.num_ranks <= gpus_per_node || t.num_ranks % gpus_per_node == 0,
                      "--gpus-per-node: {} does not divide the trace's num_ranks {}", gpus_per_node,
                      t.num_ranks);
  const Topology topo = Topology::contiguous(t.num_ranks, gpus_per_node, t.num_experts);
  std::fprintf(
      human_out(), "%s\n  model %s, %d experts, top-%d, %d ranks x %lld tokens, %zu steps\n  %s\n",
      printable(path).c_str(), printable(t.model).c_str(), t.num_experts, t.top_k, t.num_ranks,
      static_cast<long long>(t.tokens_per_rank), t.steps.size(), topo.describe().c_str());
  if (t.expert_shape)
    std::fprintf(human_out(), "  expert shape %s\n", t.expert_shape->describe().c_str());
  if (!t.generator_json.empty()) {
    std::fprintf(human_out(), "  generator %s\n", printable(t.generator_json).c_str());
  }
  if (!t.uniform()) say_token_range(t, "  ");
  // Per layer: expert skew (busiest expert / mean expert) and GPU skew under contiguous placement.
  std::map<int64_t, std::vector<const RoutingStep*>> by_layer;
  for (const RoutingStep& s : t.steps) by_layer[s.layer].push_back(&s);
  std::fprintf(human_out(), "\n  %-6s %6s %22s %22s %24s\n", "layer", "steps", "expert max/mean",
               "GPU max/mean", "static straggler rows");
  std::fprintf(human_out(), "  %-6s %6s %22s %22s %24s\n", "", "", "mean (min..max)",
               "mean (min..max)", "mean (p95)");
  for (const auto& [layer, steps] : by_layer) {
    std::vector<double> ex, gpu, st;
    for (const RoutingStep* s : steps) {
      std::vector<double> p(s->expert_counts.begin(), s->expert_counts.end());
      ex.push_back(max_over_mean(p));
      std::vector<double> loads(static_cast<size_t>(t.num_ranks), 0.0);
      for (int e = 0; e < t.num_experts; ++e)
        loads[topo.home(e)] += static_cast<double>(s->expert_counts[e]);
      gpu.push_back(max_over_mean(loads));
      st.push_back(*std::max_element(loads.begin(), loads.end()) - mean_of(loads));
    }
    auto range = [](const std::vector<double>& v) {
      return fmt::format("{:.2f} ({:.2f}..{:.2f})", mean_of(v),
                         *std::min_element(v.begin(), v.end()),
                         *std::max_element(v.begin(), v.end()));
    };
    std::fprintf(human_out(), "  %-6lld %6zu %22s %22s %24s\n", static_cast<long long>(layer),
                 steps.size(), range(ex).c_str(), range(gpu).c_str(),
                 fmt::format("{:.0f} ({:.0f})", mean_of(st), quantile_of(st, 0.95)).c_str());
  }
}

}  // namespace

void add_trace_commands(CLI::App& app) {
  CLI::App* trace = app.add_subcommand("trace", "Make (gen) or describe (info) routing traces");
  trace->require_subcommand(1);

  auto g = std::make_shared<GenOptions>();
  CLI::App* gen = trace->add_subcommand(
      "gen", "Generate a feplb-trace-v1 file from an expert-popularity prior");
  non_empty(
      gen->add_option("--out", g->out, "output trace file, - for standard output (required)"));
  non_empty(gen->add_option("--prior", g->prior,
                            "real-model prior file (schema: data/priors/README.md)"));
  add_real(*gen, "--skew", g->skew, 1.0, static_cast<double>(limits::kMaxExperts),
           "instead of --prior: lognormal popularity with this max/mean over experts (below "
           "--experts)");
  gen->add_option(
         "--hot-gpus", g->hot_gpus,
         "instead of --prior/--skew: many-donor skew, these loads (x the mean, comma-separated) "
         "on that many GPUs of every NVLink domain, the others from --cold-min up; --skew is "
         "then the max/mean over a GPU's experts (default 2)")
      ->delimiter(',')
      ->check(CLI::Validator(
          [](std::string& item) -> std::string {
            char* end = nullptr;
            errno = 0;
            const double v = std::strtod(item.c_str(), &end);
            if (item.empty() || end != item.c_str() + item.size() || errno == ERANGE ||
                !std::isfinite(v)) {
              return "'" + item +
                     "' is not a number (loads x the mean, comma-separated, e.g. 1.5,1.2)";
            }
            if (v < 0 || v > 1e6) return "'" + item + "' is outside [0, 1e6]";
            return {};
          },
          "LOADS", "loads"));
  add_real(*gen, "--cold-min", g->cold_min, 0.0, 1.0,
           "with --hot-gpus: load of the coldest GPU of a domain, x the mean (default 0.2)");
  add_int(*gen, "--gpus-per-node", g->gpus_per_node, 1, limits::kMaxRanks,
          "with --hot-gpus: GPUs per NVLink domain (default 8)");
  add_int(*gen, "--layers", g->layers, 1, 4096,
          "with --skew or --hot-gpus: number of layers, each its own popularity (default 1)");
  add_int(*gen, "--experts", g->experts, 2, limits::kMaxExperts,
          "experts (default: the prior's; a multiple of it widens the prior; 128 with --skew)");
  add_int(*gen, "--top-k", g->top_k, 1, limits::kMaxExperts,
          "experts per token (default: the prior's top-k; 8 with --skew)");
  add_int(*gen, "--ranks", g->spec.num_ranks, 1, limits::kMaxRanks, "EP ranks (GPUs) (default 8)");
  add_int(*gen, "--tokens-per-rank", g->spec.tokens_per_rank, 0, int64_t{1} << 24,
          "tokens per rank per micro-batch (default 4096)");
  add_int(*gen, "--seq-len", g->spec.seq_len, 1, int64_t{1} << 24,
          "tokens per sequence (default 4096)");
  add_real(*gen, "--concentration", g->spec.concentration, 0.0, 1e12,
           "Dirichlet concentration of per-sequence popularity; 0: none (default 2000)");
  add_int(*gen, "--steps", g->spec.num_steps, 1, limits::kMaxStepId,
          "micro-batches; each has one entry per layer (default 16; steps x layers x ranks x "
          "experts may not exceed the trace limit of 2^27 counts)");
  add_int(*gen, "--seed", g->spec.seed, "random seed (default 1)");
  add_model_flag(*gen, g->model,
                 "model name stored in the trace (default: the prior's, or lognormal)");
  gen->add_flag("--force", g->force, "overwrite an existing --out file");
  gen->add_flag("--quiet", g->quiet, "no progress lines on stderr");
  add_shape_flags(*gen, g->shape);
  gen->callback([g] { run_gen(*g); });

  auto path = std::make_shared<std::string>();
  auto gpn = std::make_shared<int>(8);
  CLI::App* info =
      trace->add_subcommand("info", "Describe a trace: skew per layer, static straggler");
  non_empty(info->add_option(
      "trace", *path, "trace file, - for standard input (default: data/traces/default.json)"));
  add_int(*info, "--gpus-per-node,--domain-size", *gpn, 1, limits::kMaxRanks,
          "GPUs per NVLink domain (default 8)");
  info->callback([path, gpn] { run_info(path->empty() ? default_trace_path() : *path, *gpn); });
}

}  // namespace feplb::cli
