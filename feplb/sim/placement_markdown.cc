// The placement report as Markdown (targets, tables, what the numbers show) and JSON, from a
// PlacementReportResult (placement_report.h).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "feplb/core/error.h"
#include "feplb/core/placement.h"
#include "feplb/core/text.h"
#include "feplb/sim/internal/report_parts.h"
#include "feplb/sim/internal/report_util.h"
#include "feplb/sim/markdown.h"
#include "feplb/sim/placement_report.h"
#include "feplb/sim/report.h"

namespace feplb {
namespace {

using md::mib;
using md::pct;

const PlacementCell& cell(const PlacementGroup& g, const std::string& setting,
                          const std::string& policy) {
  const PlacementCell* c = g.find(setting, policy);
  FEPLB_CHECK(c != nullptr, "placement report: no '{}' / '{}' in '{}'", setting, policy,
              g.spec.name);
  return *c;
}

bool listed(const PlacementGroup& g, const PlacementCell& c) {
  for (const PlacementSetting& s : g.spec.settings) {
    if (s.label != c.setting) continue;
    return std::find(s.policies.begin(), s.policies.end(), c.policy) != s.policies.end();
  }
  return false;
}

// Every cell of a group: balance and bytes per (setting, policy), and the settings' migration.
std::string group_tables(const PlacementGroup& g) {
  md::Table cells({"setting", "policy", "S_T rows (% of mean)", "p95", "between nodes (% of mean)",
                   "S_G ms", "weights MiB", "token copies MiB"});
  for (const PlacementCell& c : g.cells) {
    if (!listed(g, c)) continue;
    const PolicySummary& s = c.summary;
    cells.add({c.setting, c.policy,
               fmt::format("{:.0f} ({})", s.token_straggler, pct(s.token_straggler, g.mean_rows)),
               fmt::format("{:.0f}", s.token_straggler_p95),
               fmt::format("{:.0f} ({})", s.inter_node_floor, pct(s.inter_node_floor, g.mean_rows)),
               fmt::format("{:.3f}", s.gemm_straggler_ms), mib(s.weight_bytes_per_step),
               mib(s.token_bytes_per_step)});
  }
  md::Table moves({"setting", "replans", "experts re-homed per layer: first / later replans",
                   "to another node, per replan", "migration MiB per step: all / after the first",
                   "placer ms per replan (median)"});
  for (const PlacementMigration& m : g.migrations) {
    const auto it = std::find_if(g.spec.settings.begin(), g.spec.settings.end(),
                                 [&](const PlacementSetting& s) { return s.label == m.setting; });
    if (it != g.spec.settings.end() && !it->report_migration) continue;
    moves.add({m.setting, fmt::format("{}", m.replans),
               fmt::format("{:.1f} / {:.1f}", m.rehomed_first, m.rehomed_later),
               fmt::format("{:.1f}", m.across_nodes),
               mib(m.bytes_per_step) + " / " + mib(m.later_bytes_per_step),
               fmt::format("{:.1f}", m.place_ms_median)});
  }
  return cells.str() + moves.str();
}

// What each setting of default_placement_groups() does.
constexpr std::pair<const char*, const char*> kSettingNotes[] = {
    {"contiguous", "expert e on GPU e / (E/R), never moved"},
    {"walk-forward",
     "before the first measured micro-batch and every --walk-forward after, homes and dynamic "
     "sets recomputed from the previous --window micro-batches only, improving the homes in "
     "force by swaps (--place-homes 0)"},
    {"walk-forward, from scratch",
     "the same from scratch: EPLB's packing, swaps, relabelled (--place-homes 1)"},
    {"walk-forward, window 8", "the same from 8 micro-batches of history"},
    {"placed once", "one placement from the history micro-batches, never replanned"},
    {"contiguous, history sets",
     "contiguous homes (--place-homes 2); feplb and feplb-paper take the placement's dynamic "
     "sets (--feplb-dyn-set 1, --paper-dyn-set 2)"},
    {"walk-forward, history sets", "walk-forward homes and the placement's dynamic sets"},
    {"walk-forward, history sets by mean rows",
     "the same, sets by mean rows (--place-dyn-score 1)"},
    {"walk-forward, history sets by mean + std",
     "the same, sets by mean + std of rows (--place-dyn-score 2)"},
};

// What the sections share: the first group over several nodes, the one-node groups, and the
// floor between nodes of the first with contiguous and walk-forward homes (static).
struct PlacementView {
  const PlacementReportResult& r;
  const PlacementReportConfig& c;
  const PlacementGroup* g16 = nullptr;
  std::vector<const PlacementGroup*> one_node;
  double floor_before = 0, floor_after = 0;

  explicit PlacementView(const PlacementReportResult& result) : r(result), c(result.config) {
    for (const PlacementGroup& g : r.groups) {
      if (g.domains > 1 && !g16) g16 = &g;
      if (g.domains == 1) one_node.push_back(&g);
    }
    if (g16 && g16->find("contiguous", "static") && g16->find("walk-forward", "static")) {
      floor_before = cell(*g16, "contiguous", "static").summary.inter_node_floor;
      floor_after = cell(*g16, "walk-forward", "static").summary.inter_node_floor;
    }
  }
};

// Per (one-node group, homes): feplb with history sets minus per-micro-batch sets; the
// walk-forward rows are targets too.
md::Table sets_table(const PlacementView& v, md::Table& targets) {
  md::Table sets({"workload", "homes", "feplb, per-micro-batch sets: S_T (p95)",
                  "feplb, history sets: S_T (p95)", "difference (% of mean)",
                  "feplb-paper: own history / placement's sets"});
  for (const PlacementGroup* g : v.one_node) {
    for (const char* homes : {"contiguous", "walk-forward"}) {
      const std::string with_sets = std::string(homes) + ", history sets";
      if (!g->find(homes, "feplb") || !g->find(with_sets, "feplb")) continue;
      const PolicySummary& a = cell(*g, homes, "feplb").summary;
      const PolicySummary& b = cell(*g, with_sets, "feplb").summary;
      // Means of integer rows: below half a row the two round to the same straggler.
      const double diff = std::abs(b.token_straggler - a.token_straggler) < 0.5
                              ? 0.0
                              : b.token_straggler - a.token_straggler;
      const bool paper = g->find(homes, "feplb-paper") && g->find(with_sets, "feplb-paper");
      sets.add({g->spec.name, homes,
                fmt::format("{:.0f} ({:.0f})", a.token_straggler, a.token_straggler_p95),
                fmt::format("{:.0f} ({:.0f})", b.token_straggler, b.token_straggler_p95),
                fmt::format("{:+.0f} ({:+.2f}%)", diff,
                            g->mean_rows > 0 ? diff / g->mean_rows * 100 : 0.0),
                paper ? fmt::format("{:.0f} / {:.0f}",
                                    cell(*g, homes, "feplb-paper").summary.token_straggler,
                                    cell(*g, with_sets, "feplb-paper").summary.token_straggler)
                      : "-"});
      if (std::string(homes) != "walk-forward") continue;
      targets.add({fmt::format("{}: feplb with the placement's (history) dynamic sets no worse "
                               "than with per-micro-batch sets, on walk-forward homes",
                               g->spec.name),
                   fmt::format("{:+.0f} rows ({:+.2f}% of the mean)", diff,
                               g->mean_rows > 0 ? diff / g->mean_rows * 100 : 0.0),
                   md::verdict(diff <= 0)});
    }
  }
  return sets;
}

// The target between nodes (first row of the targets table).
void between_nodes_target(const PlacementView& v, md::Table& targets) {
  if (!v.g16 || !v.g16->find("contiguous", "static") || !v.g16->find("walk-forward", "static"))
    return;
  const double cut = v.floor_before > 0 ? 1 - v.floor_after / v.floor_before : 0;
  targets.add({fmt::format("{}: walk-forward cuts the imbalance between nodes by >= 50% "
                           "against contiguous homes",
                           v.g16->spec.name),
               fmt::format("{:.0f} -> {:.0f} rows per GPU ({} -> {} of the mean): {:.0f}% lower",
                           v.floor_before, v.floor_after, pct(v.floor_before, v.g16->mean_rows),
                           pct(v.floor_after, v.g16->mean_rows), cut * 100),
               md::verdict(cut >= 0.5)});
}

// The workload paragraph and the settings' table.
std::string workload_section(const PlacementView& v) {
  const PlacementReportConfig& c = v.c;
  const Knobs& k = c.sim.knobs;
  std::string out = fmt::format(
      "**Workload.** The {} real-model priors (data/priors/) widened to {} experts, top-{}, {} "
      "tokens per GPU, sequences of {} tokens, seed {}; per prior {} micro-batches of history "
      "then {} measured, 3 layers each; {} GPUs per NVLink domain; the Dirichlet concentration "
      "per sequence (lower: more volatile routing) in each group's title. The priors do not "
      "drift. Expert shape {}; {}; GEMM times from the {} model. Walk-forward replans every {} "
      "micro-batches from the previous {}; a swap of homes must gain {:.2f}% of the mean load. "
      "Migration charges every re-homed expert's weights ({} MiB) and optimizer state ({:.0f} "
      "bytes per parameter) once.\n\n",
      c.prior_paths.size(), c.num_experts, c.top_k, c.workload.tokens_per_rank, c.workload.seq_len,
      c.workload.seed, c.warmup_steps, c.workload.num_steps, c.gpus_per_node,
      c.sim.shape.describe(), describe_gpu(find_gpu_class(c.sim.gpu), c.sim.knobs),
      c.sim.cost_label, c.replan_interval, c.replan_window, k.place_min_gain * 100,
      mib(static_cast<double>(c.sim.shape.weight_bytes())), k.optimizer_bytes_per_param);
  md::Table t({"setting", "what it does"});
  for (const auto& [label, note] : kSettingNotes) t.add({label, note});
  return out + t.str();
}

// 3. How long placing takes.
std::string timing_section(const PlacementView& v) {
  md::Table t({"EP", "nodes", "experts", "history micro-batches", "homes", "median ms",
               "min / max ms", "experts re-homed"});
  for (const PlacementTiming& x : v.r.timings) {
    t.add({fmt::format("{}", x.ranks), fmt::format("{}", x.domains), fmt::format("{}", x.experts),
           fmt::format("{}", x.steps), x.mode, fmt::format("{:.1f}", x.median_ms),
           fmt::format("{:.1f} / {:.1f}", x.min_ms, x.max_ms), fmt::format("{}", x.rehomed)});
  }
  return fmt::format(
             "## 3. How long placing takes\n\nOne layer's history ({}), placed from contiguous "
             "homes by one Placer::place call, {} runs on {}, one thread (Google Benchmark: "
             "`scripts/bench-cpu --out bench/results/cpu-placement.json --force "
             "--benchmark_filter=place`).\n\n",
             v.r.timing_prior, v.c.timing_reps, v.r.machine) +
         t.str();
}

// Section 4's rows of the first group over several nodes: homes against balancing, improving the
// homes in force against placing from scratch, the first replan, replanning against one placement.
void show_between_nodes(const PlacementView& v, md::Table& show) {
  if (!v.g16 || !v.g16->find("walk-forward", "static") || !v.g16->find("contiguous", "feplb"))
    return;
  const PlacementGroup& g = *v.g16;
  const Knobs& k = v.c.sim.knobs;
  const PolicySummary& sw = cell(g, "walk-forward", "static").summary;
  const PolicySummary& fc = cell(g, "contiguous", "feplb").summary;
  show.add(
      {fmt::format("{}: static on walk-forward homes vs feplb on contiguous homes", g.spec.name),
       fmt::format("{} vs {} (feplb cannot go below the floor between nodes, {})",
                   pct(sw.token_straggler, g.mean_rows), pct(fc.token_straggler, g.mean_rows),
                   pct(v.floor_before, g.mean_rows))});
  const PlacementMigration* wf = g.migration("walk-forward");
  const PlacementMigration* fs = g.migration("walk-forward, from scratch");
  if (wf && fs && g.find("walk-forward, from scratch", "static")) {
    show.add(
        {"improving the homes in force vs placing from scratch: floor between nodes, experts "
         "re-homed per later replan, MiB per step after the first replan",
         fmt::format("{:.0f} vs {:.0f} rows; {:.1f} vs {:.1f}; {} vs {}", v.floor_after,
                     cell(g, "walk-forward, from scratch", "static").summary.inter_node_floor,
                     wf->rehomed_later, fs->rehomed_later, mib(wf->later_bytes_per_step),
                     mib(fs->later_bytes_per_step))});
    show.add(
        {"the first replan: experts re-homed per layer, GiB per trace (of it between "
         "nodes), seconds on one NIC",
         fmt::format("{:.1f}; {:.1f} ({:.1f}); {:.1f} s at {:.0f} GB/s", wf->rehomed_first,
                     wf->first_bytes / (kMiB * 1024), wf->first_network_bytes / (kMiB * 1024),
                     wf->first_network_bytes / (k.internode_gbps * 1e9), k.internode_gbps)});
  }
  if (g.find("placed once", "static") && g.find("walk-forward, window 8", "static")) {
    show.add(
        {"floor between nodes: placed once / walk-forward / window 8 (stationary priors: "
         "replanning can at best match one placement)",
         fmt::format("{:.0f} / {:.0f} / {:.0f} rows",
                     cell(g, "placed once", "static").summary.inter_node_floor, v.floor_after,
                     cell(g, "walk-forward, window 8", "static").summary.inter_node_floor)});
  }
}

// Section 4's rows of each one-node group: feplb on both homes, and its dynamic-set scores.
void show_one_node(const PlacementView& v, md::Table& show) {
  for (const PlacementGroup* g : v.one_node) {
    if (!g->find("walk-forward", "feplb") || !g->find("contiguous", "feplb")) continue;
    const PolicySummary& fw = cell(*g, "walk-forward", "feplb").summary;
    const PolicySummary& fc = cell(*g, "contiguous", "feplb").summary;
    show.add({fmt::format("{}: feplb on contiguous vs walk-forward homes: S_T, weights + token "
                          "copies MiB per step",
                          g->spec.name),
              fmt::format("{} vs {}; {} + {} vs {} + {}", pct(fc.token_straggler, g->mean_rows),
                          pct(fw.token_straggler, g->mean_rows), mib(fc.weight_bytes_per_step),
                          mib(fc.token_bytes_per_step), mib(fw.weight_bytes_per_step),
                          mib(fw.token_bytes_per_step))});
    const PlacementCell* base = g->find("walk-forward, history sets", "feplb");
    const PlacementCell* mean = g->find("walk-forward, history sets by mean rows", "feplb");
    const PlacementCell* std_ = g->find("walk-forward, history sets by mean + std", "feplb");
    if (!base || !mean || !std_) continue;
    show.add({fmt::format("{}: feplb with history sets by score 0 / 1 / 2", g->spec.name),
              fmt::format("{} / {} / {}", pct(base->summary.token_straggler, g->mean_rows),
                          pct(mean->summary.token_straggler, g->mean_rows),
                          pct(std_->summary.token_straggler, g->mean_rows))});
  }
}

}  // namespace

std::string format_placement_markdown(const PlacementReportResult& r, const std::string& command) {
  const PlacementView v(r);
  double worst_ms = 0;
  for (const PlacementTiming& t : r.timings) worst_ms = std::max(worst_ms, t.max_ms);
  md::Table targets({"target", "measured", "verdict"});
  between_nodes_target(v, targets);
  const md::Table sets = sets_table(v, targets);
  targets.add({"placing 128 experts from a 1,000-step history takes < 1 s",
               fmt::format("slowest run {:.1f} ms ({})", worst_ms, r.machine),
               md::verdict(worst_ms < 1000 && !r.timings.empty())});
  std::string out = fmt::format(
      "# The macro timescale: history-based expert placement\n\n"
      "Generated by `{}` (do not edit by hand; rerun it). Raw numbers: the file given to --json. "
      "The algorithm, the file format and the walk-forward simulation: "
      "[../placement.md](../placement.md); columns: docs/metrics.md ('between nodes' is the "
      "in-domain floor, max over nodes of ceil(node rows / GPUs) - mean).\n\n"
      "## Targets\n\n",
      printable(command));
  out += targets.str();
  out += workload_section(v);
  if (v.g16) {
    out += fmt::format("## 1. Between nodes: {}\n\n", v.g16->spec.name) + group_tables(*v.g16);
  }
  out += "## 2. Dynamic sets from history: one node\n\n" + sets.str();
  for (const PlacementGroup* g : v.one_node) {
    out += fmt::format("### {} (Dirichlet concentration {:.0f})\n\n", g->spec.name,
                       g->spec.concentration) +
           group_tables(*g);
  }
  out += timing_section(v);
  md::Table show({"comparison", "measured"});
  show_between_nodes(v, show);
  show_one_node(v, show);
  out += "## 4. What the numbers show\n\n" + show.str();
  out +=
      "Not simulated: migration time (like the paper, moves are assumed to hide in a checkpoint; "
      "only their bytes are charged), drift of the router's popularity (the priors are "
      "stationary), and replicas (one home per expert; docs/results/balance.md has EPLB's).\n";
  return out;
}

namespace {

using ojson = nlohmann::ordered_json;

ojson placement_config_json(const PlacementReportConfig& c) {
  ojson priors = ojson::array();
  for (const std::string& p : c.prior_paths) priors.push_back(file_stem(p));
  return {{"priors", priors},
          {"num_experts", c.num_experts},
          {"top_k", c.top_k},
          {"gpus_per_node", c.gpus_per_node},
          {"tokens_per_rank", c.workload.tokens_per_rank},
          {"seq_len", c.workload.seq_len},
          {"seed", c.workload.seed},
          {"warmup_micro_batches", c.warmup_steps},
          {"measured_micro_batches", c.workload.num_steps},
          {"replan_interval", c.replan_interval},
          {"replan_window", c.replan_window},
          {"place_min_gain", c.sim.knobs.place_min_gain},
          {"place_dyn_score", c.sim.knobs.place_dyn_score},
          {"dyn", c.sim.knobs.dyn},
          {"optimizer_bytes_per_param", c.sim.knobs.optimizer_bytes_per_param},
          {"gpu", gpu_json(c.sim)},
          {"cost_model", c.sim.cost_label}};
}

// One group: its settings, every (setting, policy) cell and every setting's home moves.
ojson placement_group_json(const PlacementGroup& g, const PlacementReportConfig& c) {
  ojson settings = ojson::array();
  for (const PlacementSetting& s : g.spec.settings) {
    ojson knobs = ojson::object();
    for (const KnobOverride& o : s.knobs) knobs[o.name] = o.value;
    const char* homes = s.homes == HomesSource::kContiguous    ? "contiguous"
                        : s.homes == HomesSource::kWalkForward ? "walk-forward"
                                                               : "once";
    settings.push_back({{"label", s.label},
                        {"homes", homes},
                        {"window", s.window > 0 ? s.window : c.replan_window},
                        {"knobs", knobs}});
  }
  ojson cells = ojson::array();
  for (const PlacementCell& cl : g.cells) {
    const PolicySummary& s = cl.summary;
    cells.push_back({{"setting", cl.setting},
                     {"policy", cl.policy},
                     {"token_straggler", s.token_straggler},
                     {"token_straggler_p95", s.token_straggler_p95},
                     {"token_max_over_mean", s.token_max_over_mean},
                     {"inter_node_floor", s.inter_node_floor},
                     {"gemm_straggler_ms", s.gemm_straggler_ms},
                     {"weight_bytes_per_step", s.weight_bytes_per_step},
                     {"token_bytes_per_step", s.token_bytes_per_step},
                     {"network_bytes_per_step", s.network_bytes_per_step},
                     {"fits_static_window", s.fits_static_window},
                     {"planner_us_median", s.planner_us_median},
                     {"token_straggler_reduction", s.token_straggler_reduction}});
  }
  ojson migrations = ojson::array();
  for (const PlacementMigration& m : g.migrations) {
    migrations.push_back({{"setting", m.setting},
                          {"replans", m.replans},
                          {"rehomed_per_layer_first", m.rehomed_first},
                          {"rehomed_per_layer_later", m.rehomed_later},
                          {"across_nodes_per_layer", m.across_nodes},
                          {"migration_bytes_per_step", m.bytes_per_step},
                          {"later_migration_bytes_per_step", m.later_bytes_per_step},
                          {"place_ms_median", m.place_ms_median},
                          {"first_replan_bytes", m.first_bytes},
                          {"first_replan_network_bytes", m.first_network_bytes}});
  }
  return {{"name", g.spec.name},
          {"ranks", g.spec.ranks},
          {"nvlink_domains", g.domains},
          {"concentration", g.spec.concentration},
          {"mean_rows_per_gpu", g.mean_rows},
          {"settings", settings},
          {"cells", cells},
          {"migrations", migrations}};
}

}  // namespace

std::string format_placement_json(const PlacementReportResult& r, const std::string& command) {
  ojson doc;
  doc["command"] = command;
  doc["config"] = placement_config_json(r.config);
  ojson groups = ojson::array();
  for (const PlacementGroup& g : r.groups) groups.push_back(placement_group_json(g, r.config));
  doc["groups"] = groups;
  ojson timings = ojson::array();
  for (const PlacementTiming& t : r.timings) {
    timings.push_back({{"ranks", t.ranks},
                       {"nvlink_domains", t.domains},
                       {"experts", t.experts},
                       {"history_micro_batches", t.steps},
                       {"homes", t.mode},
                       {"median_ms", t.median_ms},
                       {"min_ms", t.min_ms},
                       {"max_ms", t.max_ms},
                       {"rehomed_experts", t.rehomed}});
  }
  doc["timing"] = {{"history", r.timing_prior}, {"machine", r.machine}, {"runs", timings}};
  return doc.dump(2) + "\n";
}

}  // namespace feplb
