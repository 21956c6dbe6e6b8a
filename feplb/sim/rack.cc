#include "feplb/sim/rack.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "feplb/core/error.h"
#include "feplb/core/stats.h"
#include "feplb/sim/internal/report_parts.h"
#include "feplb/sim/internal/report_util.h"
#include "feplb/sim/prior.h"
#include "feplb/sim/report.h"
#include "feplb/sim/svg_plot.h"

namespace feplb {
namespace {

// Mean over the measured steps of a trace of (busiest expert's rows / mean expert rows).
void add_busiest(const Trace& trace, int64_t warmup, double& sum, int64_t& n) {
  for (const RoutingStep& s : trace.steps) {
    if (s.step < warmup) continue;
    std::vector<double> rows(s.expert_counts.begin(), s.expert_counts.end());
    sum += max_over_mean(rows);
    ++n;
  }
}

// Simulates every prior of `priors` at one EP size and collects the steps of each policy into
// one group (pooled over the priors).
RackGroup run_group(const RackConfig& c, const std::string& section, const std::string& workload,
                    double skew, const std::vector<Prior>& priors, const RackPoint& point,
                    const SimulationConfig& base) {
  RackGroup g;
  g.section = section;
  g.workload = workload;
  g.gpu = base.gpu;
  g.domain_size = point.domain_size;
  g.experts = priors.front().num_experts();
  std::vector<BalanceSteps> acc;
  double busiest = 0;
  int64_t n = 0;
  for (const Prior& prior : priors) {
    WorkloadSpec spec = c.workload;
    spec.num_ranks = point.ranks();
    spec.top_k = c.top_k;
    spec.num_steps = c.workload.num_steps + c.warmup_steps;
    Trace trace = generate_trace(prior, spec);
    trace.model = c.model;
    add_busiest(trace, c.warmup_steps, busiest, n);
    SimulationConfig sim = base;
    sim.gpus_per_node = point.domain_size;
    sim.warmup_steps = c.warmup_steps;
    const SimulationResult r = simulate(trace, sim);
    for (const PolicyResult& p : r.policies) collect_steps(acc, p.name, p, false, false);
    if (!r.find("feplb")) continue;
    for (const BalanceVariant& mode : c.modes) {
      SimulationConfig ms = sim;
      ms.policies = {mode.policy};
      apply_knobs(ms.knobs, mode.knobs);
      const SimulationResult rm = simulate(trace, ms);
      collect_steps(acc, mode.label, *rm.find(mode.policy), false, true);
    }
  }
  g.busiest_expert = n > 0 ? busiest / static_cast<double>(n) : 0.0;
  g.group = summarise_group(point.ranks(), point.domains, skew, acc);
  return g;
}

}  // namespace

std::string RackPoint::label() const {
  return domains == 1 ? fmt::format("{}", ranks())
                      : fmt::format("{} ({}x{})", ranks(), domains, domain_size);
}

std::string format_rack_points(const std::vector<RackPoint>& points) {
  std::vector<std::string> items;
  for (const RackPoint& p : points) {
    items.push_back(p.domains == 1 ? fmt::format("{}", p.domain_size)
                                   : fmt::format("{}x{}", p.domains, p.domain_size));
  }
  return fmt::format("{}", fmt::join(items, ","));
}

std::vector<RackPoint> parse_rack_points(const std::string& text, const char* flag) {
  std::vector<RackPoint> out;
  std::stringstream ss(text);
  const auto number = [&](const std::string& s, const std::string& item) {
    size_t used = 0;
    int v = 0;
    try {
      v = std::stoi(s, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    FEPLB_REQUIRE_INPUT(!s.empty() && used == s.size() && v >= 1 && v <= 65536,
                        "{}: '{}' is not R or NxD (R GPUs in one NVLink domain, N domains of D)",
                        flag, item);
    return v;
  };
  for (std::string item; std::getline(ss, item, ',');) {
    const size_t x = item.find('x');
    if (x == std::string::npos) {
      out.push_back({1, number(item, item)});
    } else {
      out.push_back({number(item.substr(0, x), item), number(item.substr(x + 1), item)});
    }
  }
  FEPLB_REQUIRE_INPUT(!out.empty(), "{}: no EP size in '{}'", flag, text);
  return out;
}

std::vector<std::string> rack_labels(const RackConfig& c) {
  std::vector<std::string> out = c.sim.policies;
  if (std::find(out.begin(), out.end(), "feplb") == out.end()) return out;
  for (const BalanceVariant& m : c.modes) out.push_back(m.label);
  return out;
}

const RackGroup* RackResult::find(const std::string& section, int ranks, int experts,
                                  const std::string& workload_prefix,
                                  const std::string& gpu) const {
  for (const RackGroup& g : groups) {
    if (g.section == section && g.group.ranks == ranks && (experts == 0 || g.experts == experts) &&
        g.workload.rfind(workload_prefix, 0) == 0 && (gpu.empty() || g.gpu == gpu)) {
      return &g;
    }
  }
  return nullptr;
}

namespace {

// InputError for a configuration the report cannot run.
void check_rack_config(const RackConfig& c) {
  FEPLB_REQUIRE_INPUT(!c.points.empty(), "--ranks: no EP size given");
  FEPLB_REQUIRE_INPUT(c.experts_per_gpu >= 1, "--experts-per-gpu: {} must be at least 1",
                      c.experts_per_gpu);
  FEPLB_REQUIRE_INPUT(c.warmup_steps >= 0, "--warmup: {} must be at least 0", c.warmup_steps);
  for (int k : c.few_experts_per_gpu) {
    FEPLB_REQUIRE_INPUT(k >= 1, "experts per GPU: {} must be at least 1", k);
  }
}

// The real priors of top-k models, read once; their file stems appended to `stems`.
std::vector<Prior> read_real_priors(const RackConfig& c, std::vector<std::string>& stems) {
  std::vector<Prior> real;
  for (const std::string& path : c.prior_paths) {
    Prior p = read_prior(path);
    if (p.top_k != c.top_k) continue;
    real.push_back(std::move(p));
    stems.push_back(file_stem(path));
  }
  return real;
}

}  // namespace

RackResult run_rack(const RackConfig& config, const Progress& progress) {
  const RackConfig& c = config;
  check_rack_config(c);
  RackResult result{config, {}, {}};
  std::vector<std::string>& policies = result.config.sim.policies;
  if (std::find(policies.begin(), policies.end(), "static") == policies.end()) {
    policies.insert(policies.begin(), "static");
  }
  const SimulationConfig& sim = result.config.sim;

  const std::vector<Prior> real = read_real_priors(c, result.priors);
  std::vector<std::string> models;  // the real priors' models, for the workload's label
  for (const Prior& p : real) {
    if (std::find(models.begin(), models.end(), p.model) == models.end()) models.push_back(p.model);
  }
  const std::string real_label =
      fmt::format("real priors ({} of {})", real.size(), fmt::join(models, ", "));
  const int64_t total = static_cast<int64_t>(
      c.points.size() + c.few_experts_per_gpu.size() * (real.empty() ? 1 : 2) + c.gpus.size());
  int64_t done = 0;
  const auto tick = [&] {
    if (progress) progress(++done, total);
  };
  const auto lognormal = [&](int experts, double skew) {
    FEPLB_REQUIRE_INPUT(skew >= 1 && skew < experts,
                        "skew: lognormal max/mean {} must be in [1, {}) for {} experts", skew,
                        experts, experts);
    return std::vector<Prior>{lognormal_prior(experts, skew, c.skew_layers, c.workload.seed)};
  };
  const std::string skew_label = fmt::format("lognormal max/mean {}", c.skew);

  // 1. EP from one node to racks.
  for (const RackPoint& p : c.points) {
    result.groups.push_back(run_group(c, "ep", skew_label, c.skew,
                                      lognormal(c.experts_per_gpu * p.ranks(), c.skew), p, sim));
    tick();
  }
  // 2. Few experts per GPU, hot experts, one NVLink domain.
  for (int k : c.few_experts_per_gpu) {
    if (!real.empty()) {
      const int experts = k * c.prior_ranks;
      std::vector<Prior> widened;
      for (const Prior& p : real) {
        FEPLB_REQUIRE_INPUT(experts % p.num_experts() == 0,
                            "priors: {} experts ({} per GPU at EP={}) is not a multiple of a "
                            "prior's {} experts",
                            experts, k, c.prior_ranks, p.num_experts());
        widened.push_back(expand_prior(p, experts, c.workload.seed));
      }
      result.groups.push_back(
          run_group(c, "few", real_label, 0.0, widened, {1, c.prior_ranks}, sim));
      tick();
    }
    result.groups.push_back(run_group(c, "few", fmt::format("lognormal max/mean {}", c.hot_skew),
                                      c.hot_skew, lognormal(k * c.hot_ranks, c.hot_skew),
                                      {1, c.hot_ranks}, sim));
    tick();
  }
  // 3. GPU classes side by side.
  for (const RackGpu& gpu : c.gpus) {
    SimulationConfig s = sim;
    s.gpu = gpu.name;
    s.knobs = gpu.knobs;
    s.cost = gpu.cost;
    s.cost_label = gpu.cost_label;
    result.groups.push_back(run_group(c, "gpu", skew_label, c.skew,
                                      lognormal(c.experts_per_gpu * c.gpu_point.ranks(), c.skew),
                                      c.gpu_point, s));
    tick();
  }
  return result;
}

namespace {

nlohmann::ordered_json feplb_mode_json(const std::vector<BalanceVariant>& modes) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const BalanceVariant& m : modes) {
    nlohmann::ordered_json knobs = nlohmann::ordered_json::object();
    for (const KnobOverride& o : m.knobs) knobs[o.name] = o.value;
    out.push_back({{"label", m.label}, {"policy", m.policy}, {"knobs", knobs}});
  }
  return out;
}

}  // namespace

std::string format_rack_json(const RackResult& r, const std::string& command) {
  using json = nlohmann::ordered_json;
  const RackConfig& c = r.config;
  json doc;
  doc["command"] = command;
  json points = json::array();
  for (const RackPoint& p : c.points) {
    points.push_back(
        {{"ranks", p.ranks()}, {"nvlink_domains", p.domains}, {"domain_size", p.domain_size}});
  }
  json priors = r.priors;
  json gpus = json::array();
  for (const RackGpu& g : c.gpus) {
    SimulationConfig s = c.sim;
    s.gpu = g.name;
    s.knobs = g.knobs;
    json one = gpu_json(s);
    one["cost_model"] = g.cost_label;
    gpus.push_back(one);
  }
  doc["config"] = {
      {"points", points},
      {"lognormal_skew", c.skew},
      {"experts_per_gpu", c.experts_per_gpu},
      {"skew_layers", c.skew_layers},
      {"priors", priors},
      {"prior_ranks", c.prior_ranks},
      {"hot_skew", c.hot_skew},
      {"hot_ranks", c.hot_ranks},
      {"few_experts_per_gpu", c.few_experts_per_gpu},
      {"gpu_point", {{"ranks", c.gpu_point.ranks()}, {"domain_size", c.gpu_point.domain_size}}},
      {"top_k", c.top_k},
      {"tokens_per_rank", c.workload.tokens_per_rank},
      {"measured_micro_batches", c.workload.num_steps},
      {"warmup_micro_batches", c.warmup_steps},
      {"seq_len", c.workload.seq_len},
      {"concentration", c.workload.concentration},
      {"seed", c.workload.seed},
      {"policies", c.sim.policies},
      {"feplb_modes", feplb_mode_json(c.modes)},
      {"expert_shape", c.sim.shape.describe()},
      {"gpu", gpu_json(c.sim)},
      {"cost_model", c.sim.cost_label},
      {"compared_gpus", gpus}};
  json groups = json::array();
  for (const RackGroup& g : r.groups) {
    json cells = json::array();
    for (const BalanceCell& cell : g.group.cells) {
      json one = balance_cell_json(cell);
      one["exposed_ms_p95"] = cell.summary.exposed_ms_p95;
      one["window_slack_ms_p5"] = cell.summary.window_slack_ms_p5;
      one["gemm_straggler_plus_exposed_ms"] =
          cell.summary.gemm_straggler_ms + cell.summary.exposed_ms;
      cells.push_back(one);
    }
    groups.push_back({{"section", g.section},
                      {"workload", g.workload},
                      {"gpu", g.gpu},
                      {"ranks", g.group.ranks},
                      {"nvlink_domains", g.group.domains},
                      {"domain_size", g.domain_size},
                      {"experts", g.experts},
                      {"experts_per_gpu", g.experts_per_gpu()},
                      {"busiest_expert_over_mean", g.busiest_expert},
                      {"mean_rows_per_gpu", g.group.mean_rows},
                      {"cells", cells}});
  }
  doc["groups"] = groups;
  return doc.dump(2) + "\n";
}

std::vector<std::string> rack_plot_names() { return {"rack-stragglers.svg", "rack-planner.svg"}; }

std::vector<std::pair<std::string, std::string>> rack_plots(const RackResult& r) {
  using svg::LogAxis;
  using svg::Series;
  const RackConfig& c = r.config;
  std::vector<const RackGroup*> ep;
  std::vector<std::string> xlabels;
  for (const RackGroup& g : r.groups) {
    if (g.section != "ep") continue;
    ep.push_back(&g);
    xlabels.push_back(RackPoint{g.group.domains, g.domain_size}.label());
  }
  const auto series = [&](const auto& value) {
    std::vector<Series> out;
    static constexpr const char* kModeDashes[] = {"5,3", "2,2", "8,3,2,3"};
    size_t mode = 0;
    for (const std::string& p : rack_labels(c)) {
      const bool is_mode =
          std::find(c.sim.policies.begin(), c.sim.policies.end(), p) == c.sim.policies.end();
      Series s{p,
               svg::color_of(is_mode ? "feplb" : p),
               is_mode ? kModeDashes[mode++ % std::size(kModeDashes)] : "",
               {}};
      for (const RackGroup* g : ep) {
        const BalanceCell* cell = g->group.find(p);
        s.values.push_back(cell ? value(*g, *cell) : svg::kNan);
      }
      out.push_back(std::move(s));
    }
    return out;
  };
  const std::string workload = fmt::format(
      "{}, {} experts per GPU, top-{}, {} tokens per GPU; GPU class {}; mean over measured steps",
      fmt::format("lognormal max/mean {}", c.skew), c.experts_per_gpu, c.top_k,
      c.workload.tokens_per_rank, c.sim.gpu);
  const double pw = 440, ph = 330, gap = 20, legend_w = 200;

  svg::Svg straggler(2 * pw + 3 * gap + legend_w, ph + 70);
  straggler.text(gap, 24, "Stragglers against EP size (GPUs; NxD = N NVLink domains of D)", 17,
                 "start", "#222", true);
  straggler.text(gap, 42, workload + "; log scale, 0 drawn at '0'", 11, "start", "#555");
  const auto token = series([](const RackGroup& g, const BalanceCell& cell) {
    return cell.summary.token_straggler / g.group.mean_rows * 100;
  });
  svg::line_panel(straggler, gap, 55, pw, ph, "Token straggler, % of the mean load", "EP size",
                  xlabels, token, LogAxis{0.01, 1000, 0, 0}, "%");
  svg::line_panel(straggler, 2 * gap + pw, 55, pw, ph, "GEMM straggler + exposed time, ms",
                  "EP size", xlabels, series([](const RackGroup&, const BalanceCell& cell) {
                    return cell.summary.gemm_straggler_ms + cell.summary.exposed_ms;
                  }),
                  LogAxis{0.001, 1000, 0, 0}, " ms");
  svg::legend(straggler, 3 * gap + 2 * pw, 95, token);

  svg::Svg planner(pw + 2 * gap + legend_w + 120, ph + 70);
  planner.text(gap, 24, "Planner time against EP size", 17, "start", "#222", true);
  planner.text(gap, 42, "median over steps of one plan() call, one core; log scale", 11, "start",
               "#555");
  const auto us = series(
      [](const RackGroup&, const BalanceCell& cell) { return cell.summary.planner_us_median; });
  svg::line_panel(planner, gap, 55, pw + 120, ph, "Planner time, us", "EP size", xlabels, us,
                  LogAxis{0.1, 10000, 0, 0, 16, false}, " us");
  svg::legend(planner, 2 * gap + pw + 120, 95, us);
  const std::vector<std::string> names = rack_plot_names();
  return {{names[0], straggler.done()}, {names[1], planner.done()}};
}

}  // namespace feplb
