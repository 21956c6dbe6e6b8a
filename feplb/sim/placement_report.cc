// The placement report: every setting simulated per group and prior, pooled, and the placer's
// timing (the Markdown and JSON: placement_markdown.cc).
#include "feplb/sim/placement_report.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "feplb/core/error.h"
#include "feplb/core/placement.h"
#include "feplb/core/placer.h"
#include "feplb/core/stats.h"
#include "feplb/core/text.h"
#include "feplb/sim/internal/report_parts.h"
#include "feplb/sim/internal/report_util.h"
#include "feplb/sim/markdown.h"
#include "feplb/sim/prior.h"
#include "feplb/sim/report.h"

namespace feplb {
namespace {

// "CPU model, N cores" from /proc/cpuinfo, or what is known.
std::string describe_machine() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, model = "unknown CPU", mhz;
  while (std::getline(in, line) && (model == "unknown CPU" || mhz.empty())) {
    const auto colon = line.find(':');
    if (colon == std::string::npos || colon + 2 > line.size()) continue;
    if (line.rfind("model name", 0) == 0) model = line.substr(colon + 2);
    if (line.rfind("cpu MHz", 0) == 0) mhz = line.substr(colon + 2, line.find('.') - colon - 2);
  }
  return fmt::format("{}{}, {} cores", model, mhz.empty() ? "" : " at " + mhz + " MHz",
                     std::thread::hardware_concurrency());
}

// Steps of one (setting, policy), collected over the priors of a group.
struct CellSteps {
  std::string setting, policy;
  std::vector<StepMetrics> steps;
};

struct MigrationSums {
  std::string setting;
  int64_t replans = 0, measured_steps = 0;
  double first = 0, later = 0, across = 0;
  int64_t n_first = 0, n_later = 0, n_all = 0;
  double bytes = 0, later_bytes = 0, first_bytes = 0, first_network_bytes = 0;
  std::vector<double> place_ms;
};

void add_steps(std::vector<CellSteps>& cells, const std::string& setting, const PolicyResult& p) {
  for (CellSteps& c : cells) {
    if (c.setting == setting && c.policy == p.name) {
      c.steps.insert(c.steps.end(), p.steps.begin(), p.steps.end());
      return;
    }
  }
  cells.push_back({setting, p.name, p.steps});
}

void add_migration(MigrationSums& m, const SimulationResult& r) {
  const auto layers = static_cast<double>(std::max<size_t>(1, r.final_placement.layers.size()));
  m.measured_steps += static_cast<int64_t>(r.step_ids.size());
  for (size_t i = 0; i < r.replans.size(); ++i) {
    const Migration& mg = r.replans[i].migration;
    const auto rehomed = static_cast<double>(mg.rehomed_experts) / layers;
    ++m.replans;
    ++m.n_all;
    m.across += static_cast<double>(mg.across_nodes) / layers;
    m.bytes += static_cast<double>(mg.total_bytes());
    m.place_ms.push_back(r.replans[i].place_ms);
    if (i == 0) {
      m.first += rehomed;
      m.first_bytes += static_cast<double>(mg.total_bytes());
      m.first_network_bytes += static_cast<double>(mg.network_bytes);
      ++m.n_first;
    } else {
      m.later += rehomed;
      m.later_bytes += static_cast<double>(mg.total_bytes());
      ++m.n_later;
    }
  }
}

PlacementMigration finish(const MigrationSums& m) {
  PlacementMigration out;
  out.setting = m.setting;
  out.replans = m.replans;
  const auto ratio = [](double a, int64_t n) { return n ? a / static_cast<double>(n) : 0.0; };
  out.rehomed_first = ratio(m.first, m.n_first);
  out.rehomed_later = ratio(m.later, m.n_later);
  out.across_nodes = ratio(m.across, m.n_all);
  out.bytes_per_step = ratio(m.bytes, m.measured_steps);
  out.later_bytes_per_step = ratio(m.later_bytes, m.measured_steps);
  out.place_ms_median = quantile_of(m.place_ms, 0.5);
  out.first_bytes = ratio(m.first_bytes, m.n_first);
  out.first_network_bytes = ratio(m.first_network_bytes, m.n_first);
  return out;
}

// Simulates one setting on one trace.
SimulationResult simulate_setting(const Trace& trace, const PlacementReportConfig& c,
                                  const PlacementSetting& s) {
  SimulationConfig sim = c.sim;
  sim.policies = s.policies;
  sim.gpus_per_node = c.gpus_per_node;
  sim.warmup_steps = c.warmup_steps;
  apply_knobs(sim.knobs, s.knobs);
  switch (s.homes) {
    case HomesSource::kContiguous:
      break;
    case HomesSource::kWalkForward:
      sim.replan_interval = c.replan_interval;
      sim.replan_window = s.window > 0 ? s.window : c.replan_window;
      break;
    case HomesSource::kOnce:
      // A replan comes before micro-batch warmup + j * interval: with this interval, only j = 0.
      sim.replan_interval = std::numeric_limits<int32_t>::max();
      sim.replan_window = c.warmup_steps;
      break;
  }
  return simulate(trace, sim);
}

std::vector<PlacementTiming> time_placer(const PlacementReportConfig& c, std::string& source) {
  std::string path = c.prior_paths.front();
  for (const std::string& p : c.prior_paths) {
    if (file_stem(p) == c.timing_prior) path = p;
  }
  const Prior prior = expand_prior(read_prior(path), c.num_experts, c.workload.seed);
  const int history_ranks = *std::max_element(c.timing_ranks.begin(), c.timing_ranks.end());
  WorkloadSpec spec = c.workload;
  spec.num_ranks = history_ranks;
  spec.top_k = c.top_k;
  LayerHistory h;
  h.layer = prior.layer_ids.front();
  h.num_steps = c.timing_steps;
  for (int64_t t = 0; t < c.timing_steps; ++t) {
    const RoutingStep s = generate_step(prior.popularity.front(), spec, t, h.layer);
    h.rows.insert(h.rows.end(), s.expert_counts.begin(), s.expert_counts.end());
  }
  source = fmt::format("{}, layer {}, {} micro-batches at EP={}", file_stem(path), h.layer,
                       c.timing_steps, history_ranks);
  std::vector<PlacementTiming> out;
  for (int ranks : c.timing_ranks) {
    const Placement current =
        contiguous_placement(ranks, c.gpus_per_node, c.num_experts, {h.layer}, c.sim.knobs.dyn);
    for (HomesMode mode : {HomesMode::kImprove, HomesMode::kFresh}) {
      PlaceOptions options = place_options(c.sim.knobs);
      options.homes = mode;
      std::vector<double> ms;
      PlacementTiming t;
      for (int rep = 0; rep < c.timing_reps; ++rep) {
        const auto t0 = std::chrono::steady_clock::now();
        Placer placer(ranks, c.gpus_per_node, c.num_experts, options);
        std::vector<LayerPlaceStats> stats;
        const Placement next = placer.place({&h, 1}, current, &stats);
        ms.push_back(
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count());
        t.rehomed = stats.front().rehomed;
      }
      t.ranks = ranks;
      t.domains = Topology::contiguous(ranks, c.gpus_per_node, c.num_experts).num_domains();
      t.experts = c.num_experts;
      t.steps = c.timing_steps;
      t.mode = mode == HomesMode::kImprove ? "improve (from contiguous)" : "from scratch";
      t.median_ms = quantile_of(ms, 0.5);
      t.min_ms = *std::min_element(ms.begin(), ms.end());
      t.max_ms = *std::max_element(ms.begin(), ms.end());
      out.push_back(t);
    }
  }
  return out;
}

}  // namespace

std::vector<PlacementGroupSpec> default_placement_groups() {
  const std::vector<KnobOverride> history_sets = {{"feplb_dyn_set", 1}, {"paper_dyn_set", 2}};
  auto with = [](std::vector<KnobOverride> a, const std::vector<KnobOverride>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  using H = HomesSource;
  const std::vector<std::string> three = {"static", "feplb", "oracle"};
  PlacementGroupSpec two_nodes{"EP=16, 2 nodes", 16, 2000, {}};
  two_nodes.settings = {
      {"contiguous", H::kContiguous, three, {}, 0},
      {"walk-forward", H::kWalkForward, three, {}, 0},
      {"walk-forward, from scratch", H::kWalkForward, three, {{"place_homes", 1}}, 0},
      {"walk-forward, window 8", H::kWalkForward, three, {}, 8},
      {"placed once", H::kOnce, three, {}, 0},
  };
  const std::vector<std::string> four = {"static", "feplb-paper", "feplb", "oracle"};
  const std::vector<std::string> planners = {"feplb-paper", "feplb"};
  std::vector<PlacementSetting> one_node = {
      {"contiguous", H::kContiguous, four, {}, 0},
      {"contiguous, history sets", H::kWalkForward, planners,
       with(history_sets, {{"place_homes", 2}}), 0},
      {"walk-forward", H::kWalkForward, four, {}, 0},
      {"walk-forward, history sets", H::kWalkForward, planners, history_sets, 0, false},
      {"walk-forward, history sets by mean rows",
       H::kWalkForward,
       {"feplb"},
       with(history_sets, {{"place_dyn_score", 1}}),
       0,
       false},
      {"walk-forward, history sets by mean + std",
       H::kWalkForward,
       {"feplb"},
       with(history_sets, {{"place_dyn_score", 2}}),
       0,
       false},
  };
  return {two_nodes,
          {"EP=8, 1 node", 8, 2000, one_node},
          {"EP=8, 1 node, volatile routing", 8, 50, one_node}};
}

const PlacementCell* PlacementGroup::find(const std::string& setting,
                                          const std::string& policy) const {
  for (const PlacementCell& c : cells) {
    if (c.setting == setting && c.policy == policy) return &c;
  }
  return nullptr;
}

const PlacementMigration* PlacementGroup::migration(const std::string& setting) const {
  for (const PlacementMigration& m : migrations) {
    if (m.setting == setting) return &m;
  }
  return nullptr;
}

const PlacementGroup* PlacementReportResult::find(const std::string& name) const {
  for (const PlacementGroup& g : groups) {
    if (g.spec.name == name) return &g;
  }
  return nullptr;
}

PlacementReportResult run_placement_report(const PlacementReportConfig& config,
                                           const Progress& progress) {
  FEPLB_REQUIRE_INPUT(!config.prior_paths.empty(), "priors: none found");
  FEPLB_REQUIRE_INPUT(config.warmup_steps >= 1,
                      "--warmup: {} must be at least 1 (the first placement's history)",
                      config.warmup_steps);
  FEPLB_REQUIRE_INPUT(config.replan_interval >= 1, "--walk-forward: {} must be at least 1",
                      config.replan_interval);
  FEPLB_REQUIRE_INPUT(config.timing_steps >= 1, "--timing-steps: {} must be at least 1",
                      config.timing_steps);
  FEPLB_REQUIRE_INPUT(config.timing_reps >= 1 && !config.timing_ranks.empty(),
                      "placement timing: needs at least one repetition and one EP size");
  PlacementReportResult result{config, {}, {}, {}, describe_machine()};
  const int64_t total = static_cast<int64_t>(config.groups.size() * config.prior_paths.size()) + 1;
  int64_t done = 0;
  std::vector<Prior> priors;
  for (const std::string& path : config.prior_paths) {
    priors.push_back(expand_prior(read_prior(path), config.num_experts, config.workload.seed));
  }
  for (const PlacementGroupSpec& spec : config.groups) {
    PlacementGroup g;
    g.spec = spec;
    g.domains =
        Topology::contiguous(spec.ranks, config.gpus_per_node, config.num_experts).num_domains();
    std::vector<CellSteps> cells;
    std::vector<MigrationSums> sums;
    for (const PlacementSetting& s : spec.settings) {
      if (s.homes == HomesSource::kContiguous) continue;
      sums.emplace_back();
      sums.back().setting = s.label;
    }
    for (const Prior& prior : priors) {
      WorkloadSpec w = config.workload;
      w.num_ranks = spec.ranks;
      w.top_k = config.top_k;
      w.concentration = spec.concentration;
      w.num_steps = config.workload.num_steps + config.warmup_steps;
      Trace trace = generate_trace(prior, w);
      trace.model = config.model;
      for (const PlacementSetting& s : spec.settings) {
        const SimulationResult r = simulate_setting(trace, config, s);
        for (const PolicyResult& p : r.policies) add_steps(cells, s.label, p);
        for (MigrationSums& m : sums) {
          if (m.setting == s.label) add_migration(m, r);
        }
      }
      if (progress) progress(++done, total);
    }
    for (const CellSteps& c : cells)
      g.cells.push_back({c.setting, c.policy, summarise_steps(c.steps)});
    for (const PlacementSetting& s : spec.settings) {
      const PlacementCell* base = g.find(s.label, "static");
      FEPLB_CHECK(base != nullptr, "placement report: no static in '{}'", s.label);
      const PolicySummary base_summary = base->summary;
      std::vector<PolicySummary*> all;
      for (PlacementCell& c : g.cells) {
        if (c.setting == s.label) all.push_back(&c.summary);
      }
      apply_reductions(all, base_summary);
    }
    double rows = 0;
    for (const StepMetrics& m : cells.front().steps) rows += m.mean_rows;
    g.mean_rows = rows / static_cast<double>(std::max<size_t>(1, cells.front().steps.size()));
    for (const MigrationSums& m : sums) g.migrations.push_back(finish(m));
    result.groups.push_back(std::move(g));
  }
  result.timings = time_placer(config, result.timing_prior);
  if (progress) progress(++done, total);
  return result;
}

}  // namespace feplb
