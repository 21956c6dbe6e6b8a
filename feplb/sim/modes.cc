#include "feplb/sim/modes.h"

#include <algorithm>
#include <map>

#include "feplb/core/error.h"
#include "feplb/core/expert_shape.h"
#include "feplb/sim/gemm_tables.h"
#include "feplb/sim/internal/report_parts.h"
#include "feplb/sim/internal/report_util.h"
#include "feplb/sim/prior.h"
#include "feplb/sim/rack.h"

namespace feplb {
namespace {

// The expert shapes the workloads use: GLM-5's (core.md, rack.md: the known model shape,
// expert_shape.h) and balance.md section 8's (BalanceConfig::many_donor_shapes).
using NamedShape = BalanceConfig::Shape;
const NamedShape kGlm5{"GLM-5", *shape_for_model("glm5")};

// What one workload needs: its traces' priors, EP size and domain, shape, history and steps.
struct Spec {
  std::string section, name;
  NamedShape shape;
  std::vector<Prior> priors;  // pooled: one trace each
  int ranks = 8, domain_size = 8, experts = 128;
  int64_t warmup = 0, steps = 16;
};

class Runner {
 public:
  Runner(const ModesConfig& c, ModesResult& r) : c_(c), r_(r) {}

  void run(const Spec& s) {
    const CostModelChoice cost =
        c_.cost_dir.empty()
            ? CostModelChoice{nullptr, roofline_label(c_.sim.knobs, find_gpu_class(c_.sim.gpu))}
            : find_gemm_table(c_.cost_dir, "data/cost", s.shape.shape, c_.sim.knobs,
                              find_gpu_class(c_.sim.gpu));
    SimulationConfig sim = c_.sim;
    sim.policies = {"static", "feplb", "llep", "moonep"};
    sim.gpus_per_node = s.domain_size;
    sim.warmup_steps = s.warmup;
    sim.shape = s.shape.shape;
    sim.cost = cost.model.get();
    sim.cost_label = cost.label;
    std::vector<BalanceSteps> acc;
    for (const Prior& prior : s.priors) {
      WorkloadSpec spec = c_.workload;
      spec.num_ranks = s.ranks;
      spec.top_k = 8;
      spec.num_steps = s.steps + s.warmup;
      Trace trace = generate_trace(prior, spec);
      trace.model = s.shape.name;
      const SimulationResult base = simulate(trace, sim);
      for (const PolicyResult& p : base.policies) collect_steps(acc, p.name, p, false, false);
      for (const BalanceVariant& v : c_.modes) {
        SimulationConfig vs = sim;
        vs.policies = {v.policy};
        apply_knobs(vs.knobs, v.knobs);
        const SimulationResult rv = simulate(trace, vs);
        collect_steps(acc, v.label, *rv.find(v.policy), false, true);
      }
    }
    const Topology topo = Topology::contiguous(s.ranks, s.domain_size, s.experts);
    BalanceGroup g = summarise_group(s.ranks, topo.num_domains(), 0.0, acc);
    ModesWorkload w;
    w.section = s.section;
    w.name = s.name;
    w.shape_name = s.shape.name;
    w.ranks = s.ranks;
    w.experts = s.experts;
    w.cells = std::move(g.cells);
    r_.workloads.push_back(std::move(w));
  }

 private:
  const ModesConfig& c_;
  ModesResult& r_;
};

}  // namespace

std::vector<BalanceVariant> explicit_feplb_modes() {
  std::vector<BalanceVariant> out;
  for (int one_hop : {0, 1}) {
    for (int prefetch : {0, 1}) {
      for (bool time : {false, true}) {
        for (int copy_timing : {1, 3}) {
          BalanceVariant v;
          v.policy = "feplb";
          v.label = fmt::format("{}{}{}{}", one_hop ? "one-hop" : "two-phase",
                                prefetch ? " + prefetch" : "", time ? " + time" : "",
                                copy_timing == 3 ? " + late copies" : "");
          v.knobs = {{"one_hop", static_cast<double>(one_hop)},
                     {"prefetch", static_cast<double>(prefetch)},
                     {"copy_timing", static_cast<double>(copy_timing)},
                     {"balance_time_weight", 0.0},
                     {"time_balance_budget", time ? 0.05 : 0.0}};
          // Time balancing within a budget plans four times: 40 us reserved ahead of the copies
          // (two-phase), as balance.md's time modes.
          if (time && !one_hop) v.knobs.push_back({"planner_budget_us", 40.0});
          out.push_back(std::move(v));
        }
      }
    }
  }
  return out;
}

const BalanceCell* ModesWorkload::find(const std::string& label) const {
  for (const BalanceCell& c : cells) {
    if (c.label == label) return &c;
  }
  return nullptr;
}

const BalanceCell* ModesWorkload::best_mode(const std::vector<BalanceVariant>& modes) const {
  bool any_reaches = false;
  for (const BalanceVariant& m : modes) {
    const BalanceCell* c = find(m.label);
    any_reaches =
        any_reaches || (c && c->summary.token_straggler_reduction >= kAnchorTargetReduction);
  }
  const BalanceCell* best = nullptr;
  for (const BalanceVariant& m : modes) {
    const BalanceCell* c = find(m.label);
    if (!c || (any_reaches && c->summary.token_straggler_reduction < kAnchorTargetReduction))
      continue;
    if (!best || gemm_plus_exposed(*c) < gemm_plus_exposed(*best)) best = c;
  }
  return best;
}

ModesVerdict judge(const ModesWorkload& w, const std::vector<BalanceVariant>& modes) {
  ModesVerdict v;
  const BalanceCell* def = w.find("feplb");
  const BalanceCell* best = w.best_mode(modes);
  if (!def || !best) return v;
  const double d = gemm_plus_exposed(*def), b = gemm_plus_exposed(*best);
  v.near_best = d <= b + std::max(0.05 * b, 0.005);
  for (const char* anchor : {"llep", "moonep"}) {
    const BalanceCell* a = w.find(anchor);
    if (a && b <= gemm_plus_exposed(*a) && d > gemm_plus_exposed(*a)) v.beats_anchors = false;
  }
  v.token_ok = best->summary.token_straggler_reduction < kAnchorTargetReduction ||
               def->summary.token_straggler_reduction >= kAnchorTargetReduction;
  return v;
}

namespace {

// core.md: every real prior at EP 2, 4, 8, GLM-5 experts, no history.
void add_core_specs(const ModesConfig& c, const std::map<std::string, Prior>& widened,
                    std::vector<Spec>& specs) {
  for (int ranks : {2, 4, 8}) {
    for (const auto& [stem, prior] : widened) {
      Spec s{"core", fmt::format("{}, EP={}", stem, ranks), kGlm5, {prior}, ranks, 8};
      s.steps = c.workload.num_steps;
      specs.push_back(std::move(s));
    }
  }
}

// balance.md section 8: many donors at the EP of its targets (8), its three shapes, its history
// and measured micro-batches (16 and 16).
void add_many_donor_specs(const std::map<std::string, Prior>& widened, std::vector<Spec>& specs) {
  const BalanceConfig md;  // balance.md's workloads, as `feplb report --anchors` runs them
  const int ranks = md.many_donor_target_ranks;
  for (const NamedShape& sh : md.many_donor_shapes) {
    Spec gen{"many-donor",
             fmt::format("generator, many donors, {}", sh.name),
             sh,
             {many_donor_prior(md.num_experts, ranks, md.gpus_per_node, md.many_donor_hot,
                               md.many_donor_cold_min, md.many_donor_expert_skew, md.skew_layers,
                               md.skew_seed)},
             ranks,
             md.gpus_per_node,
             md.num_experts,
             md.warmup_steps,
             md.workload.num_steps};
    specs.push_back(std::move(gen));
    for (const auto& [stem, prior] : widened) {
      if (!shows_many_donors(prior, ranks)) continue;
      specs.push_back({"many-donor",
                       fmt::format("{}, {}", stem, sh.name),
                       sh,
                       {prior},
                       ranks,
                       md.gpus_per_node,
                       md.num_experts,
                       md.warmup_steps,
                       md.workload.num_steps});
    }
  }
}

// The real priors of top-k `top_k` whose experts divide `experts`, each widened to `experts`.
std::vector<Prior> real_priors_widened(const ModesConfig& c, int top_k, int experts) {
  std::vector<Prior> real;
  for (const std::string& path : c.prior_paths) {
    Prior p = read_prior(path);
    if (p.top_k != top_k || experts % p.num_experts() != 0) continue;
    real.push_back(expand_prior(p, experts, c.workload.seed));
  }
  return real;
}

// rack.md: lognormal max/mean 5, 4 experts per GPU, from one node to racks; few experts per
// GPU with hot experts (real top-8 priors at EP=64, lognormal max/mean 13 at EP=72); its
// history and measured micro-batches (8 and 8).
void add_rack_specs(const ModesConfig& c, std::vector<Spec>& specs) {
  const RackConfig rack;  // rack.md's workloads, as `feplb report --rack` runs them by default
  for (const RackPoint& p : rack.points) {
    const int ranks = p.ranks(), experts = rack.experts_per_gpu * ranks;
    Spec s{"rack",
           fmt::format("lognormal max/mean {:g}, {} experts per GPU, EP={}{}", rack.skew,
                       rack.experts_per_gpu, ranks,
                       p.domains > 1 ? fmt::format(" ({}x{})", p.domains, p.domain_size) : ""),
           kGlm5,
           {lognormal_prior(experts, rack.skew, rack.skew_layers, c.workload.seed)},
           ranks,
           p.domain_size,
           experts,
           rack.warmup_steps,
           rack.workload.num_steps};
    specs.push_back(std::move(s));
  }
  for (int k : rack.few_experts_per_gpu) {
    const int prior_experts = k * rack.prior_ranks, hot_experts = k * rack.hot_ranks;
    std::vector<Prior> real = real_priors_widened(c, rack.top_k, prior_experts);
    if (!real.empty()) {
      specs.push_back(
          {"few experts",
           fmt::format("real priors ({}), {} per GPU, EP={}", real.size(), k, rack.prior_ranks),
           kGlm5, std::move(real), rack.prior_ranks, rack.prior_ranks, prior_experts,
           rack.warmup_steps, rack.workload.num_steps});
    }
    specs.push_back(
        {"few experts",
         fmt::format("lognormal max/mean {:g}, {} per GPU, EP={}", rack.hot_skew, k,
                     rack.hot_ranks),
         kGlm5,
         {lognormal_prior(hot_experts, rack.hot_skew, rack.skew_layers, c.workload.seed)},
         rack.hot_ranks,
         rack.hot_ranks,
         hot_experts,
         rack.warmup_steps,
         rack.workload.num_steps});
  }
}

// Large NVLink domains: the real priors (pooled; top-8 ones) at EP=32, 64, 72 and 256 in one
// domain with 2, 4 and 8 experts per GPU, Qwen3-235B experts, rack.md's history and measured
// micro-batches (8 and 8).
void add_large_domain_specs(const ModesConfig& c, std::vector<Spec>& specs) {
  const RackConfig rack;
  const NamedShape qwen{"Qwen3-235B", *shape_for_model("qwen3-235b")};
  for (int ranks : c.large_domain_ranks) {
    for (int k : c.large_domain_experts_per_gpu) {
      const int experts = k * ranks;
      std::vector<Prior> real = real_priors_widened(c, rack.top_k, experts);
      if (real.empty()) continue;
      specs.push_back({"large domains",
                       fmt::format("real priors ({}), {} per GPU, EP={}", real.size(), k, ranks),
                       qwen, std::move(real), ranks, ranks, experts, rack.warmup_steps,
                       rack.workload.num_steps});
    }
  }
}

}  // namespace

ModesResult run_modes(const ModesConfig& config, const Progress& progress) {
  const ModesConfig& c = config;
  FEPLB_REQUIRE_INPUT(!c.core || !c.prior_paths.empty(), "priors: none found");
  ModesResult result{config, {}};
  std::vector<Spec> specs;
  std::map<std::string, Prior> widened;  // stem -> prior widened to 128 experts
  for (const std::string& path : c.prior_paths) {
    widened[file_stem(path)] = expand_prior(read_prior(path), 128, c.workload.seed);
  }
  if (c.core) add_core_specs(c, widened, specs);
  if (c.many_donor) add_many_donor_specs(widened, specs);
  if (c.rack) add_rack_specs(c, specs);
  if (c.large_domains) add_large_domain_specs(c, specs);
  if (!c.only.empty()) {
    std::erase_if(specs, [&](const Spec& s) {
      return fmt::format("{}: {}", s.section, s.name).find(c.only) == std::string::npos;
    });
    FEPLB_REQUIRE_INPUT(!specs.empty(), "--workloads: no workload matches '{}'", c.only);
  }
  Runner runner(c, result);
  int64_t done = 0;
  for (const Spec& s : specs) {
    runner.run(s);
    if (progress) progress(++done, static_cast<int64_t>(specs.size()));
  }
  return result;
}

}  // namespace feplb
