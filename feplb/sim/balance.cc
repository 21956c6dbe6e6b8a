#include "feplb/sim/balance.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "feplb/core/error.h"
#include "feplb/core/placement.h"
#include "feplb/core/placer.h"
#include "feplb/core/planners/eplb_rebalance.h"
#include "feplb/core/stats.h"
#include "feplb/sim/gemm_tables.h"
#include "feplb/sim/internal/report_parts.h"
#include "feplb/sim/internal/report_util.h"
#include "feplb/sim/prior.h"
#include "feplb/sim/report.h"

namespace feplb {
namespace {

constexpr const char* kPlaced = ", placed homes";

// Simulates `trace` with each layer's homes placed once from the layer's warm-up micro-batches:
// EPLB's hierarchical packing, no replicas (pack_homes in placer.h). Adds the experts re-homed
// per layer.
SimulationResult simulate_placed(const Trace& trace, const SimulationConfig& base, int domains,
                                 double& rehomed_sum, int64_t& layers) {
  SimulationConfig cfg = base;
  cfg.placement = contiguous_placement(trace.num_ranks, base.gpus_per_node, trace.num_experts,
                                       trace_layers(trace), base.knobs.dyn);
  const Topology contiguous =
      Topology::contiguous(trace.num_ranks, base.gpus_per_node, trace.num_experts);
  // The warm-up steps: the first warmup_steps micro-batches (distinct step ids, in trace order).
  size_t history_end = 0;
  for (int64_t distinct = 0; history_end < trace.steps.size(); ++history_end) {
    if (history_end == 0 || trace.steps[history_end].step != trace.steps[history_end - 1].step) {
      if (++distinct > base.warmup_steps) break;
    }
  }
  const std::vector<LayerHistory> histories = layer_histories(trace, 0, history_end);
  for (LayerPlacement& l : cfg.placement.layers) {
    std::vector<double> load(static_cast<size_t>(trace.num_experts), 0.0);
    for (const LayerHistory& h : histories) {
      if (h.layer != l.layer) continue;
      for (int64_t t = 0; t < h.num_steps; ++t) {
        for (int e = 0; e < trace.num_experts; ++e) {
          load[e] += static_cast<double>(h.rows[static_cast<size_t>(t) * trace.num_experts + e]);
        }
      }
    }
    l.home = pack_homes(load, trace.num_ranks, domains);
    set_lowest_dynamic(trace.num_ranks, base.knobs.dyn, l);
    for (int e = 0; e < trace.num_experts; ++e) {
      rehomed_sum += l.home[e] != contiguous.home(e) ? 1 : 0;
    }
  }
  layers += static_cast<int64_t>(cfg.placement.layers.size());
  return simulate(trace, cfg);
}

// The many-donor section: per shape, EP size and workload, every policy and feplb's modes.
void run_many_donor(const BalanceConfig& config, BalanceResult& result) {
  std::map<std::string, std::string> prior_of;  // stem -> path
  if (!config.many_donor_priors.empty()) {
    for (const std::string& path : config.many_donor_priors) {
      result.many_donor_priors.push_back(file_stem(path));
      prior_of[file_stem(path)] = path;
    }
  } else {
    for (const std::string& path : config.prior_paths) {
      const Prior p = expand_prior(read_prior(path), config.num_experts, config.workload.seed);
      if (!shows_many_donors(p, std::min(8, config.gpus_per_node))) continue;
      result.many_donor_priors.push_back(file_stem(path));
      prior_of[file_stem(path)] = path;
    }
  }
  for (const BalanceConfig::Shape& sh : config.many_donor_shapes) {
    const CostModelChoice cost =
        config.cost_dir.empty()
            ? CostModelChoice{nullptr,
                              roofline_label(config.sim.knobs, find_gpu_class(config.sim.gpu))}
            : find_gemm_table(config.cost_dir, "data/cost", sh.shape, config.sim.knobs,
                              find_gpu_class(config.sim.gpu));
    for (int ranks : config.many_donor_ranks) {
      struct Workload {
        std::string name;
        Prior prior;
      };
      std::vector<Workload> workloads;
      workloads.push_back(
          {"generator, many donors",
           many_donor_prior(config.num_experts, ranks, config.gpus_per_node, config.many_donor_hot,
                            config.many_donor_cold_min, config.many_donor_expert_skew,
                            config.skew_layers, config.skew_seed)});
      for (const std::string& path : result.many_donor_priors) {
        workloads.push_back({path, expand_prior(read_prior(prior_of[path]), config.num_experts,
                                                config.workload.seed)});
      }
      for (const Workload& w : workloads) {
        WorkloadSpec spec = config.workload;
        spec.num_ranks = ranks;
        spec.top_k = config.top_k;
        spec.num_steps = config.workload.num_steps + config.warmup_steps;
        Trace trace = generate_trace(w.prior, spec);
        trace.model = sh.name;
        SimulationConfig sim = result.config.sim;
        sim.gpus_per_node = config.gpus_per_node;
        sim.warmup_steps = config.warmup_steps;
        sim.shape = sh.shape;
        sim.cost = cost.model.get();
        sim.cost_label = cost.label;
        std::vector<BalanceSteps> acc;
        const SimulationResult r = simulate(trace, sim);
        for (const PolicyResult& p : r.policies) collect_steps(acc, p.name, p, false, false);
        for (const BalanceVariant& v : config.many_donor_modes) {
          SimulationConfig vs = sim;
          vs.policies = {v.policy};
          apply_knobs(vs.knobs, v.knobs);
          const SimulationResult rv = simulate(trace, vs);
          collect_steps(acc, v.label, *rv.find(v.policy), false, true);
        }
        const Topology topo = Topology::contiguous(ranks, config.gpus_per_node, config.num_experts);
        BalanceGroup g = summarise_group(ranks, topo.num_domains(), 0.0, acc);
        g.workload = w.name;
        g.shape_name = sh.name;
        g.shape = sh.shape;
        g.cost_label = cost.label;
        result.many_donor.push_back(std::move(g));
      }
    }
  }
}

}  // namespace

void collect_steps(std::vector<BalanceSteps>& acc, const std::string& label, const PolicyResult& pr,
                   bool placed, bool variant) {
  for (BalanceSteps& a : acc) {
    if (a.label == label) {
      a.steps.insert(a.steps.end(), pr.steps.begin(), pr.steps.end());
      return;
    }
  }
  acc.push_back({label, pr.name, pr.movement, placed, variant, pr.steps});
}

BalanceGroup summarise_group(int ranks, int domains, double skew, std::vector<BalanceSteps>& acc) {
  BalanceGroup g;
  g.ranks = ranks;
  g.domains = domains;
  g.skew = skew;
  double rows = 0;
  for (const StepMetrics& m : acc.front().steps) rows += m.mean_rows;
  g.mean_rows =
      acc.front().steps.empty() ? 0.0 : rows / static_cast<double>(acc.front().steps.size());
  std::vector<PolicySummary*> all;
  g.cells.reserve(acc.size());
  for (BalanceSteps& a : acc) {
    BalanceCell c;
    c.label = a.label;
    c.policy = a.policy;
    c.movement = a.movement;
    c.placed = a.placed;
    c.variant = a.variant;
    c.summary = summarise_steps(a.steps);
    std::vector<double> floor;
    for (const StepMetrics& m : a.steps) {
      c.max_token_straggler = std::max(c.max_token_straggler, m.token_straggler);
      c.max_token_max_over_mean = std::max(c.max_token_max_over_mean, m.token_max_over_mean);
      c.max_guest_slots = std::max(c.max_guest_slots, static_cast<double>(m.max_guest_slots));
      c.max_network_bytes = std::max(c.max_network_bytes, static_cast<double>(m.network_bytes));
      floor.push_back(m.oracle_straggler);
    }
    c.oracle_straggler = mean_of(floor);
    g.cells.push_back(std::move(c));
  }
  for (BalanceCell& c : g.cells) all.push_back(&c.summary);
  const BalanceCell* base = g.find("static");
  FEPLB_CHECK(base != nullptr, "balance: no static policy");
  apply_reductions(all, base->summary);
  return g;
}

double gemm_plus_exposed(const BalanceCell& c) {
  return c.summary.gemm_straggler_ms + c.summary.exposed_ms;
}

bool meets_anchor_target(const BalanceCell& feplb, const BalanceCell* llep,
                         const BalanceCell* moonep, double min_fits) {
  const double t = gemm_plus_exposed(feplb);
  return feplb.summary.token_straggler_reduction >= kAnchorTargetReduction &&
         feplb.summary.fits_static_window >= min_fits && (!llep || t <= gemm_plus_exposed(*llep)) &&
         (!moonep || t <= gemm_plus_exposed(*moonep));
}

bool shows_many_donors(const Prior& prior, int ranks) {
  const int E = prior.num_experts();
  if (ranks < 2 || E % ranks != 0) return false;
  for (const std::vector<double>& pop : prior.popularity) {
    std::vector<double> load(static_cast<size_t>(ranks), 0.0);
    for (int e = 0; e < E; ++e) load[e / (E / ranks)] += pop[e] * ranks;  // x the mean
    int over = 0, under = 0;
    for (double l : load) {
      over += l > 1.2 ? 1 : 0;
      under += l < 0.6 ? 1 : 0;
    }
    if (over >= 2 && under >= 2) return true;
  }
  return false;
}

namespace {

// An explicit feplb mode: two-phase, no prefetch, hidden copies, rows (every switch set, so the
// default's chooser is out of it), with `changes` on top.
BalanceVariant explicit_feplb(std::string label, std::vector<KnobOverride> changes) {
  std::vector<KnobOverride> knobs = {
      {"one_hop", 0}, {"prefetch", 0}, {"copy_timing", 1}, {"time_balance_budget", 0}};
  for (const KnobOverride& c : changes) {
    auto it = std::find_if(knobs.begin(), knobs.end(),
                           [&](const KnobOverride& k) { return k.name == c.name; });
    if (it != knobs.end())
      it->value = c.value;
    else
      knobs.push_back(c);
  }
  return {std::move(label), "feplb", std::move(knobs)};
}

}  // namespace

std::vector<BalanceVariant> feplb_modes() {
  return {explicit_feplb("feplb prefetch", {{"prefetch", 1}}),
          explicit_feplb("feplb one-hop", {{"one_hop", 1}}),
          explicit_feplb("feplb prefetch + one-hop", {{"prefetch", 1}, {"one_hop", 1}}),
          explicit_feplb("feplb prefetch + one-hop + late copies",
                         {{"prefetch", 1}, {"one_hop", 1}, {"copy_timing", 3}})};
}

std::vector<BalanceVariant> many_donor_modes() {
  std::vector<BalanceVariant> v = feplb_modes();
  v.push_back(explicit_feplb("feplb time, no budget", {{"balance_time_weight", 1}}));
  // Two-phase, the plan is made while the GPUs compute; time balancing plans four times, so it
  // reserves 40 us for the planner ahead of the copies (measured: 15-40 us on balance.md's
  // workloads).
  v.push_back(
      explicit_feplb("feplb prefetch + time",
                     {{"prefetch", 1}, {"time_balance_budget", 0.05}, {"planner_budget_us", 40}}));
  v.push_back(explicit_feplb("feplb prefetch + one-hop + time",
                             {{"prefetch", 1}, {"one_hop", 1}, {"time_balance_budget", 0.05}}));
  return v;
}

std::vector<BalanceVariant> default_balance_variants() {
  std::vector<BalanceVariant> v;
  for (bool placed : {false, true}) {
    for (int pct : {2, 5, 8, 10, 12, 15, 20}) {
      v.push_back({fmt::format("feplb{} tol {}%", placed ? ", placed homes," : "", pct),
                   "feplb",
                   {{"balance_tolerance", pct / 100.0}},
                   placed});
    }
  }
  const std::vector<BalanceVariant> anchors = {
      {"eplb every 4", "eplb", {{"eplb_interval", 4}, {"eplb_window", 4}}},
      {"eplb every 16", "eplb", {{"eplb_interval", 16}, {"eplb_window", 16}}},
      {"eplb R=0", "eplb", {{"eplb_redundant_per_gpu", 0}}},
      {"eplb R=2", "eplb", {{"eplb_redundant_per_gpu", 2}}},
      {"eplb no dup", "eplb", {{"eplb_forbid_duplicates", 1}}},
      {"eplb global", "eplb", {{"eplb_policy", 2}}},
      {"llep cap 1.05", "llep", {{"llep_cap_factor", 1.05}}},
      {"llep cap 1.2", "llep", {{"llep_cap_factor", 1.2}}},
      {"llep cap 1.3", "llep", {{"llep_cap_factor", 1.3}}},
  };
  v.insert(v.end(), anchors.begin(), anchors.end());
  return v;
}

const BalanceCell* BalanceGroup::find(const std::string& label) const {
  for (const BalanceCell& c : cells) {
    if (c.label == label) return &c;
  }
  return nullptr;
}

const BalanceGroup* BalanceResult::find(int ranks, double skew) const {
  for (const BalanceGroup& g : groups) {
    if (g.ranks == ranks && g.skew == skew) return &g;
  }
  return nullptr;
}

namespace {

// The workloads of the report: the real priors widened to its experts, then the lognormal skews.
struct BalanceWorkload {
  std::string name;
  double skew;  // 0: real prior
  Prior prior;
};
std::vector<BalanceWorkload> balance_workloads(const BalanceConfig& config) {
  std::vector<BalanceWorkload> workloads;
  for (const std::string& path : config.prior_paths) {
    workloads.push_back({file_stem(path), 0.0,
                         expand_prior(read_prior(path), config.num_experts, config.workload.seed)});
  }
  for (double skew : config.skews) {
    workloads.push_back(
        {fmt::format("lognormal {}", skew), skew,
         lognormal_prior(config.num_experts, skew, config.skew_layers, config.skew_seed)});
  }
  return workloads;
}

// A real prior's trace beyond the policies: the placed policies (re-homed experts counted into
// `rehomed` over `layers`) and, at the Pareto EP, every variant, their steps into `acc`.
void collect_real_extras(const BalanceConfig& config, const Trace& trace,
                         const SimulationConfig& sim, int num_domains, int ranks,
                         std::vector<BalanceSteps>& acc, double& rehomed, int64_t& layers) {
  SimulationConfig placed = sim;
  placed.policies = config.placed_policies;
  const SimulationResult rp = simulate_placed(trace, placed, num_domains, rehomed, layers);
  for (const PolicyResult& p : rp.policies) collect_steps(acc, p.name + kPlaced, p, true, false);
  if (ranks != config.pareto_ranks) return;
  for (const BalanceVariant& v : config.variants) {
    SimulationConfig vs = sim;
    vs.policies = {v.policy};
    apply_knobs(vs.knobs, v.knobs);
    double unused = 0;
    int64_t unused_layers = 0;
    const SimulationResult rv = v.placed_homes
                                    ? simulate_placed(trace, vs, num_domains, unused, unused_layers)
                                    : simulate(trace, vs);
    collect_steps(acc, v.label, *rv.find(v.policy), v.placed_homes, true);
  }
}

}  // namespace

BalanceResult run_balance(const BalanceConfig& config, const Progress& progress) {
  FEPLB_REQUIRE_INPUT(!config.prior_paths.empty() || !config.skews.empty(), "priors: none found");
  FEPLB_REQUIRE_INPUT(!config.ranks.empty(), "--ranks: none given");
  FEPLB_REQUIRE_INPUT(config.warmup_steps >= 0, "--warmup: {} must be at least 0",
                      config.warmup_steps);
  BalanceResult result;
  result.config = config;
  std::vector<std::string>& policies = result.config.sim.policies;
  if (std::find(policies.begin(), policies.end(), "static") == policies.end()) {
    policies.insert(policies.begin(), "static");
  }

  const std::vector<BalanceWorkload> workloads = balance_workloads(config);
  const int64_t total = static_cast<int64_t>(config.ranks.size() * workloads.size());
  int64_t done = 0;
  for (int ranks : config.ranks) {
    const Topology topo = Topology::contiguous(ranks, config.gpus_per_node, config.num_experts);
    std::vector<BalanceSteps> real;
    double rehomed = 0;
    int64_t layers = 0;
    for (const BalanceWorkload& w : workloads) {
      WorkloadSpec spec = config.workload;
      spec.num_ranks = ranks;
      spec.top_k = config.top_k;
      spec.num_steps = config.workload.num_steps + config.warmup_steps;
      Trace trace = generate_trace(w.prior, spec);
      trace.model = config.model;
      SimulationConfig sim = result.config.sim;
      sim.gpus_per_node = config.gpus_per_node;
      sim.warmup_steps = config.warmup_steps;
      const SimulationResult r = simulate(trace, sim);
      std::vector<BalanceSteps> one;
      std::vector<BalanceSteps>& acc = w.skew > 0 ? one : real;
      for (const PolicyResult& p : r.policies) collect_steps(acc, p.name, p, false, false);
      if (w.skew == 0) {
        collect_real_extras(config, trace, sim, topo.num_domains(), ranks, acc, rehomed, layers);
      } else {
        result.groups.push_back(summarise_group(ranks, topo.num_domains(), w.skew, one));
      }
      if (progress) progress(++done, total);
    }
    if (!real.empty()) {
      BalanceGroup g = summarise_group(ranks, topo.num_domains(), 0.0, real);
      g.rehomed_experts = layers ? rehomed / static_cast<double>(layers) : 0.0;
      result.groups.push_back(std::move(g));
    }
  }
  run_many_donor(config, result);
  return result;
}

nlohmann::ordered_json balance_cell_json(const BalanceCell& cell) {
  const PolicySummary& s = cell.summary;
  return {{"label", cell.label},
          {"policy", cell.policy},
          {"placed_homes", cell.placed},
          {"variant", cell.variant},
          {"transport", data_movement_json(cell.movement)},
          {"token_straggler", s.token_straggler},
          {"token_straggler_p95", s.token_straggler_p95},
          {"token_straggler_max", cell.max_token_straggler},
          {"token_max_over_mean", s.token_max_over_mean},
          {"token_max_over_mean_max", cell.max_token_max_over_mean},
          {"gemm_straggler_ms", s.gemm_straggler_ms},
          {"gemm_straggler_ms_p95", s.gemm_straggler_ms_p95},
          {"weight_bytes_per_step", s.weight_bytes_per_step},
          {"token_bytes_per_step", s.token_bytes_per_step},
          {"nvlink_bytes_per_step", s.nvlink_bytes_per_step},
          {"network_bytes_per_step", s.network_bytes_per_step},
          {"dispatch_nvlink_bytes_per_step", s.dispatch_nvlink_bytes_per_step},
          {"dispatch_network_bytes_per_step", s.dispatch_network_bytes_per_step},
          {"guest_slots_max", cell.max_guest_slots},
          {"network_bytes_max", cell.max_network_bytes},
          {"fits_static_window", s.fits_static_window},
          {"delayed_steps", s.delayed_steps},
          {"copy_exposed_ms", s.copy_exposed_ms},
          {"plan_exposed_ms", s.plan_exposed_ms},
          {"exposed_ms", s.exposed_ms},
          {"prefetch_bytes_per_step", s.prefetch_bytes_per_step},
          {"prefetch_wasted_bytes_per_step", s.prefetch_wasted_bytes_per_step},
          {"prefetch_hit_rate", s.prefetch_hit_rate},
          {"prefetch_coverage", s.prefetch_coverage},
          {"planner_us_median", s.planner_us_median},
          {"planner_us_p99", s.planner_us_p99},
          {"inter_node_floor", cell.oracle_straggler},
          {"token_straggler_reduction", s.token_straggler_reduction},
          {"gemm_straggler_reduction", s.gemm_straggler_reduction}};
}

std::string format_balance_json(const BalanceResult& r, const std::string& command) {
  using json = nlohmann::ordered_json;
  const BalanceConfig& c = r.config;
  json doc;
  doc["command"] = command;
  json priors = json::array();
  for (const std::string& p : c.prior_paths) priors.push_back(file_stem(p));
  json variants = json::array();
  for (const BalanceVariant& v : c.variants) {
    json knobs = json::object();
    for (const KnobOverride& o : v.knobs) knobs[o.name] = o.value;
    variants.push_back({{"label", v.label}, {"policy", v.policy}, {"knobs", knobs}});
  }
  doc["config"] = {{"priors", priors},
                   {"lognormal_skews", c.skews},
                   {"ranks", c.ranks},
                   {"gpus_per_node", c.gpus_per_node},
                   {"num_experts", c.num_experts},
                   {"top_k", c.top_k},
                   {"tokens_per_rank", c.workload.tokens_per_rank},
                   {"measured_micro_batches", c.workload.num_steps},
                   {"warmup_micro_batches", c.warmup_steps},
                   {"seq_len", c.workload.seq_len},
                   {"concentration", c.workload.concentration},
                   {"seed", c.workload.seed},
                   {"policies", c.sim.policies},
                   {"gpu", gpu_json(c.sim)},
                   {"pareto_ranks", c.pareto_ranks},
                   {"variants", variants}};
  const auto cells_json = [](const BalanceGroup& g) {
    json cells = json::array();
    for (const BalanceCell& cell : g.cells) cells.push_back(balance_cell_json(cell));
    return cells;
  };
  json groups = json::array();
  for (const BalanceGroup& g : r.groups) {
    groups.push_back(
        {{"ranks", g.ranks},
         {"nvlink_domains", g.domains},
         {"workload", g.skew > 0 ? fmt::format("lognormal max/mean {}", g.skew) : "real priors"},
         {"mean_rows_per_gpu", g.mean_rows},
         {"rehomed_experts_per_layer", g.rehomed_experts},
         {"cells", cells_json(g)}});
  }
  json many = json::array();
  for (const BalanceGroup& g : r.many_donor) {
    many.push_back({{"ranks", g.ranks},
                    {"nvlink_domains", g.domains},
                    {"workload", g.workload},
                    {"shape", g.shape_name},
                    {"hidden", g.shape.hidden},
                    {"ffn", g.shape.ffn},
                    {"cost_model", g.cost_label},
                    {"mean_rows_per_gpu", g.mean_rows},
                    {"cells", cells_json(g)}});
  }
  doc["many_donor"] = many;
  doc["groups"] = groups;
  return doc.dump(2) + "\n";
}

}  // namespace feplb
