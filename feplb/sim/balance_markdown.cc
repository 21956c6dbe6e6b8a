// docs/results/balance.md from a BalanceResult: tables built from the result, and a few sentences
// of template. Every number is computed here from the result.
#include <algorithm>
#include <cmath>

#include "feplb/core/error.h"
#include "feplb/core/text.h"
#include "feplb/sim/balance.h"
#include "feplb/sim/internal/report_util.h"
#include "feplb/sim/markdown.h"

namespace feplb {
namespace {

using md::mib;
using md::pct;

constexpr double kTargetShare = 0.02;  // "within 2% of the mean load"

// What each policy moves and when (docs/planners.md has the algorithms).
struct PolicyNote {
  const char* name;
  const char* moves;
  const char* when;
};

constexpr PolicyNote kNotes[] = {
    {"static", "nothing (plain EP)", "never"},
    {"feplb-paper", "whole dynamic experts: weights and token rows, inside a node",
     "every micro-batch"},
    {"feplb", "dynamic experts, whole or split: weights and token rows, inside a node",
     "every micro-batch"},
    {"fastermoe", "the hottest experts' weights to every GPU (rows stay at the source)",
     "every micro-batch"},
    {"oracle", "any rows inside a node, no slot or copy limit (a yardstick)", "every micro-batch"},
    {"eplb", "replica weights at replans; tokens dispatched to the replicas",
     "every eplb_interval micro-batches"},
    {"llep", "an expert's weights to each helper; spilled rows dispatched there (any GPU)",
     "every micro-batch"},
    {"moonep", "remote experts' weights prefetched; rows dispatched so each GPU gets S*K",
     "every micro-batch"},
};

const PolicyNote* note_of(const std::string& name) {
  for (const PolicyNote& n : kNotes) {
    if (name == n.name) return &n;
  }
  return nullptr;
}

const BalanceCell& cell(const BalanceGroup& g, const std::string& label) {
  const BalanceCell* c = g.find(label);
  FEPLB_CHECK(c != nullptr, "balance: no '{}' at EP={}", label, g.ranks);
  return *c;
}

std::string sms(const DataMovement& t) {
  return fmt::format("{} ({}) / {} ({}{})", t.dispatch, t.dispatch_sms, t.balance, t.balance_sms,
                     t.balance_every_micro_batch || t.balance_sms == 0 ? "" : ", at replans only");
}

// Main policies and placed homes of one group (the variants are in the Pareto table).
std::string group_table(const BalanceGroup& g) {
  md::Table t({"policy", "S_T rows (% of mean)", "max/mean", "S_G ms", "weights MiB",
               "token copies MiB", "NVLink MiB: dispatch / balancing",
               "network MiB: dispatch / balancing", "guest slots", "fits", "exposed ms",
               "planner us"});
  for (const BalanceCell& c : g.cells) {
    if (c.variant) continue;
    const PolicySummary& s = c.summary;
    t.add({c.label,
           fmt::format("{:.0f} ({})", s.token_straggler, pct(s.token_straggler, g.mean_rows)),
           fmt::format("{:.3f}", s.token_max_over_mean), fmt::format("{:.3f}", s.gemm_straggler_ms),
           mib(s.weight_bytes_per_step), mib(s.token_bytes_per_step),
           mib(s.dispatch_nvlink_bytes_per_step) + " / " + mib(s.nvlink_bytes_per_step),
           mib(s.dispatch_network_bytes_per_step) + " / " + mib(s.network_bytes_per_step),
           fmt::format("{:.0f}", c.max_guest_slots),
           fmt::format("{:.0f}%", s.fits_static_window * 100),
           fmt::format("{:.3f}", s.copy_exposed_ms), fmt::format("{:.1f}", s.planner_us_median)});
  }
  return t.str();
}

// Section 8's summary: feplb's target against the anchors at EP = `ranks` (the config's
// many_donor_target_ranks), every workload and shape.
std::string many_donor_targets(const std::vector<BalanceGroup>& groups, int ranks) {
  constexpr double kMinFits = 0.95;
  std::vector<std::string> settings;  // feplb and its modes, as the first such group lists them
  for (const BalanceGroup& g : groups) {
    if (g.ranks != ranks) continue;
    for (const BalanceCell& c : g.cells) {
      if (c.label == "feplb" || c.label.rfind("feplb ", 0) == 0) settings.push_back(c.label);
    }
    break;
  }
  if (settings.empty()) return "";
  std::vector<std::string> header = {"experts", "workload", "static max/mean"};
  header.insert(header.end(), settings.begin(), settings.end());
  header.insert(header.end(), {"llep", "moonep", "target met by"});
  md::Table t(header);
  const auto both = [](const BalanceCell* x) {
    return x ? fmt::format("{:.1f}% / {:.3f}", x->summary.token_straggler_reduction * 100,
                           gemm_plus_exposed(*x))
             : std::string("-");
  };
  int rows = 0, met_rows = 0;
  for (const BalanceGroup& g : groups) {
    if (g.ranks != ranks) continue;
    const BalanceCell* st = g.find("static");
    const BalanceCell* ll = g.find("llep");
    const BalanceCell* mo = g.find("moonep");
    std::vector<std::string> row = {
        g.shape_name, g.workload,
        fmt::format("{:.2f}", st ? st->summary.token_max_over_mean : 0.0)};
    std::vector<std::string> met;
    for (const std::string& l : settings) {
      const BalanceCell* fe = g.find(l);
      row.push_back(both(fe));
      if (fe && meets_anchor_target(*fe, ll, mo, kMinFits)) met.push_back(l);
    }
    row.push_back(both(ll));
    row.push_back(both(mo));
    row.push_back(met.empty() ? std::string("none") : fmt::format("**{}**", fmt::join(met, ", ")));
    t.add(std::move(row));
    ++rows;
    met_rows += met.empty() ? 0 : 1;
  }
  return fmt::format(
      "\n### Targets at EP={}\n\nTarget for feplb: at least {:.0f}% less token straggler than "
      "static, copies fitting the window in at least {:.0f}% of the steps, and GEMM straggler + "
      "exposed time no higher than LLEP's and MoonEP's. Each setting: token-straggler reduction / "
      "S_G + exposed ms. Met on {} of {} workloads.\n\n{}",
      ranks, kAnchorTargetReduction * 100, kMinFits * 100, met_rows, rows, t.str());
}

// Section 8: many-donor skew, per shape, EP size and workload.
std::string many_donor_section(const BalanceResult& r) {
  if (r.many_donor.empty()) return "";
  const BalanceConfig& c = r.config;
  std::string hot;
  for (double h : c.many_donor_hot) hot += fmt::format("{}{}", hot.empty() ? "" : ", ", h);
  std::string out = fmt::format(
      "\n## 8. Many-donor skew\n\n"
      "Several GPUs of a domain overloaded at once while the others sit deeply below the mean: "
      "the receivers with the most room have the least own work to hide copies behind. "
      "**Workloads:** the generator's many-donor mode (`trace gen --hot-gpus {} --cold-min {} "
      "--skew {}`: per layer and NVLink domain, {} GPUs at those loads x the mean, the others "
      "spaced evenly from {} x up; {} layers, seed {}), and the real priors that show it ({}); "
      "the same {} tokens per GPU, top-{}, {} experts, {} history micro-batches then {} measured. "
      "**Modes:** `feplb` is the default (it chooses its path, prefetch, rows or GEMM time and "
      "late copies per layer: docs/planners.md); the others are explicit modes (the knobs below "
      "set, the rest as the paper's: two-phase, weights copied after the plan); `prefetch` copies "
      "the predicted weights before routing (`--prefetch 1`), `one-hop` "
      "plans before the dispatch and sends migrated rows straight to their helper (`--one-hop "
      "1`), its planner time charged to every GPU; `late copies` "
      "also takes copies that land after the helper's own work when it still finishes by the "
      "busiest non-donating GPU's GEMM time (`--copy-timing 3`); `time` balances the modelled "
      "GEMM time instead of rows, as far as the plan's token straggler stays within 5% of the "
      "unbalanced one (`--time-balance-budget 0.05`: the blend of time and rows with the most time "
      "that keeps within it, rows when none does, and the all-time plan under that row cap, each "
      "levelled along its own slices under that cap, the one with the lower GEMM straggler kept; "
      "40 us reserved for the planner, `--planner-budget-us 40`; `time, no budget`: time alone, "
      "`--balance-time-weight 1`), which matters where an expert GEMM has a fixed cost (small "
      "experts). "
      "**Columns:** "
      "S_G + exposed = the slowest GPU's GEMM time above the mean plus what the balancing adds "
      "(late copies, a plan before the dispatch: one-hop's and the anchors' planner time, "
      "docs/metrics.md); "
      "prefetch = MiB per step copied before routing (share used); fits = steps in which no GPU "
      "waited for a copy; delays = steps the balancing made slower.\n",
      hot, c.many_donor_cold_min, c.many_donor_expert_skew, c.many_donor_hot.size(),
      c.many_donor_cold_min, c.skew_layers, c.skew_seed,
      r.many_donor_priors.empty()
          ? std::string("none of the bundled ones")
          : fmt::format("{}: at least two GPUs above 1.2 x and two below 0.6 x the mean in some "
                        "layer at EP=8",
                        fmt::join(r.many_donor_priors, ", ")),
      c.workload.tokens_per_rank, c.top_k, c.num_experts, c.warmup_steps, c.workload.num_steps);
  out += many_donor_targets(r.many_donor, r.config.many_donor_target_ranks);
  std::string last_shape;
  for (const BalanceGroup& g : r.many_donor) {
    if (g.shape_name != last_shape) {
      out += fmt::format("\n### {} experts ({}); GEMM model: {}\n", g.shape_name,
                         g.shape.describe(), g.cost_label);
      last_shape = g.shape_name;
    }
    const BalanceCell* st = g.find("static");
    out += fmt::format(
        "\n**EP={}, {}** ({} NVLink domain{}; static max/mean {:.2f})\n\n"
        "| policy | S_T rows (% of mean) | S_T reduction | S_G ms | exposed ms | S_G + exposed ms "
        "| "
        "weights MiB | prefetch MiB (used) | token copies MiB | fits | delays | balancing SMs | "
        "planner us |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        g.ranks, g.workload, g.domains, g.domains > 1 ? "s" : "",
        st ? st->summary.token_max_over_mean : 0.0);
    for (const BalanceCell& cl : g.cells) {
      const PolicySummary& s = cl.summary;
      out += fmt::format(
          "| {} | {:.0f} ({}) | {} | {:.3f} | {:.3f} | {:.3f} | {} | {} | {} | {:.0f}% | {:.0f}% | "
          "{} | {:.1f} |\n",
          cl.label, s.token_straggler, pct(s.token_straggler, g.mean_rows),
          cl.label == "static" ? "" : fmt::format("{:.1f}%", s.token_straggler_reduction * 100),
          s.gemm_straggler_ms, s.exposed_ms, s.gemm_straggler_ms + s.exposed_ms,
          mib(s.weight_bytes_per_step),
          s.prefetch_bytes_per_step > 0
              ? fmt::format("{} ({:.0f}%)", mib(s.prefetch_bytes_per_step),
                            s.prefetch_hit_rate * 100)
              : "-",
          mib(s.token_bytes_per_step), s.fits_static_window * 100, s.delayed_steps * 100,
          cl.movement.balance_sms, s.planner_us_median);
    }
  }
  return out;
}

// The lowest-straggler feplb setting (contiguous or placed homes) moving at most `max_bytes`.
const BalanceCell* best_feplb_within(const BalanceGroup& g, double max_bytes, bool placed) {
  const BalanceCell* best = nullptr;
  for (const BalanceCell& c : g.cells) {
    if (c.policy != "feplb" || c.placed != placed) continue;
    if (c.summary.weight_bytes_per_step > max_bytes) continue;
    if (!best || c.summary.token_straggler < best->summary.token_straggler) best = &c;
  }
  return best;
}

// "label: S_T%, N MiB".
std::string point(const BalanceCell& c, double mean) {
  return fmt::format("{}: {}, {} MiB", c.label == "feplb" ? "feplb (default)" : c.label,
                     pct(c.summary.token_straggler, mean), mib(c.summary.weight_bytes_per_step));
}

}  // namespace

std::vector<uint8_t> pareto_front(const BalanceGroup& g, bool contiguous_only) {
  std::vector<uint8_t> front(g.cells.size(), 0);
  auto excluded = [&](const BalanceCell& c) {
    return c.policy == "oracle" || (contiguous_only && c.placed);
  };
  for (size_t i = 0; i < g.cells.size(); ++i) {
    const BalanceCell& a = g.cells[i];
    if (excluded(a)) continue;
    bool dominated = false;
    for (size_t j = 0; j < g.cells.size() && !dominated; ++j) {
      const BalanceCell& b = g.cells[j];
      if (i == j || excluded(b)) continue;
      const double wa = a.summary.weight_bytes_per_step, wb = b.summary.weight_bytes_per_step;
      const double sa = a.summary.token_straggler, sb = b.summary.token_straggler;
      dominated = wb <= wa && sb <= sa && (wb < wa || sb < sa || j < i);
    }
    front[i] = dominated ? 0 : 1;
  }
  return front;
}

namespace {

// What the sections share: the groups the later sections read.
struct BalanceView {
  const BalanceResult& r;
  const BalanceConfig& c;
  const BalanceGroup* g8;  // real priors at the Pareto EP size
  const BalanceGroup* gx;  // the largest group over several nodes (real priors)
};

// The title, the plots and the workload paragraph.
std::string header(const BalanceView& v, const std::string& command, const std::string& plot_dir) {
  const BalanceConfig& c = v.c;
  const double mean0 = v.r.groups.empty() ? 0.0 : v.r.groups.front().mean_rows;
  std::string out = fmt::format(
      "# The anchors side by side: balance against traffic\n\n"
      "Generated by `{}` (do not edit by hand; rerun it). Raw numbers: the file given to --json. "
      "Policies: docs/planners.md; columns and metrics: docs/metrics.md.\n\n",
      printable(command));
  if (!plot_dir.empty()) {
    out += fmt::format(
        "Plots: [token straggler]({0}balance-token-straggler.svg), [GEMM straggler]"
        "({0}balance-gemm-straggler.svg), [weight bytes]({0}balance-weight-bytes.svg), "
        "[Pareto]({0}balance-pareto.svg), [cross-node]({0}balance-cross-node.svg).\n\n"
        "![Pareto: token straggler against weight bytes]({0}balance-pareto.svg)\n\n",
        plot_dir);
  }
  return out + fmt::format(
                   "**Workload.** {} real-model priors (data/priors/) widened to {} experts, and "
                   "lognormal popularity with max/mean {} ({} layers each); top-{}, {} tokens per "
                   "GPU, sequences of {} tokens, Dirichlet concentration {}, seed {}; {} "
                   "micro-batches of history (observed, not measured), then {} measured. EP = {}, "
                   "{} GPUs per NVLink domain. Expert shape {}. {}; GEMM times from the {} model. "
                   "Mean rows per GPU {:.0f}: 2% of the mean is {:.0f} rows.\n\n",
                   c.prior_paths.size(), c.num_experts, fmt::join(c.skews, ", "), c.skew_layers,
                   c.top_k, c.workload.tokens_per_rank, c.workload.seq_len,
                   c.workload.concentration, c.workload.seed, c.warmup_steps, c.workload.num_steps,
                   fmt::join(c.ranks, ", "), c.gpus_per_node, c.sim.shape.describe(),
                   describe_gpu(find_gpu_class(c.sim.gpu), c.sim.knobs), c.sim.cost_label, mean0,
                   kTargetShare * mean0);
}

// Every policy: what it moves, when, the SMs its data movement holds, its guest slots.
std::string policies_section(const BalanceView& v) {
  const Knobs& k = v.c.sim.knobs;
  md::Table t({"policy", "moves", "when", "dispatch (SMs) / balancing (SMs)",
               fmt::format("guest slots at EP={}", v.c.pareto_ranks)});
  if (!v.r.groups.empty()) {
    for (const BalanceCell& cl : v.r.groups.front().cells) {
      if (cl.variant || cl.placed) continue;
      const PolicyNote* n = note_of(cl.policy);
      const BalanceCell* at8 = v.g8 ? v.g8->find(cl.label) : nullptr;
      t.add({cl.label, n ? n->moves : "", n ? n->when : "", sms(cl.movement),
             at8 ? fmt::format("{:.0f}", at8->max_guest_slots) : "-"});
    }
  }
  return "## Policies and the SMs their data movement holds\n\n" + t.str() +
         fmt::format(
             "SMs as the anchors publish them (knobs deepep_sms {}, nccl_sms {} (assumed), "
             "moonep_sms {}); copy-engine moves hold none. EPLB's replica slots are resident in "
             "every layer: {} per GPU, {:.0f} MiB per GPU per layer.\n\n",
             k.deepep_sms, k.nccl_sms, k.moonep_sms, k.eplb_redundant_per_gpu,
             static_cast<double>(k.eplb_redundant_per_gpu) *
                 static_cast<double>(v.c.sim.shape.weight_bytes()) / kMiB);
}

// 1. Each anchor against its own published behaviour, over every step.
std::string anchors_section(const BalanceView& v) {
  const Knobs& k = v.c.sim.knobs;
  double moon_worst = 0, moon_slots = 0, llep_worst = 0;
  for (const BalanceGroup& g : v.r.groups) {
    if (const BalanceCell* m = g.find("moonep")) {
      moon_worst = std::max(moon_worst, m->max_token_straggler);
      moon_slots = std::max(moon_slots,
                            m->max_guest_slots / (static_cast<double>(v.c.num_experts) / g.ranks));
    }
    if (const BalanceCell* l = g.find("llep")) {
      llep_worst = std::max(llep_worst, l->max_token_max_over_mean);
    }
  }
  md::Table t({"anchor", "its published behaviour", "measured over every step", "verdict"});
  t.add({"eplb", "the README example's phy2log", "tests/cpu/anchors_test.cc", "tested"});
  if (!v.r.groups.empty() && v.r.groups.front().find("moonep")) {
    t.add({"moonep", "every GPU computes exactly S*K rows",
           fmt::format("largest token straggler {:.0f} rows", moon_worst),
           md::verdict(moon_worst == 0)});
    t.add({"moonep", "at most E/R remote experts per GPU",
           fmt::format("{:.0f}% of E/R", moon_slots * 100), md::verdict(moon_slots <= 1)});
  }
  if (llep_worst > 0) {
    t.add({"llep", fmt::format("load at most llep_cap_factor {} x the mean", k.llep_cap_factor),
           fmt::format("highest max/mean {:.4f}", llep_worst),
           md::verdict(llep_worst <= k.llep_cap_factor + 1e-9)});
  }
  return "## 1. Each anchor reproduces its own published behaviour\n\n" + t.str();
}

// 2. Real priors at every EP size, pooled over the priors.
std::string real_priors_section(const BalanceView& v) {
  std::string out = "## 2. Real priors, every EP size (pooled over the priors)\n\n";
  for (const BalanceGroup& g : v.r.groups) {
    if (g.skew > 0) continue;
    out += fmt::format("### EP={} ({} NVLink domain{}; {:.0f} rows per GPU on average)\n\n",
                       g.ranks, g.domains, g.domains == 1 ? "" : "s", g.mean_rows);
    out += group_table(g);
  }
  return out + fmt::format(
                   "'placed homes': homes placed once from the history by EPLB's hierarchical "
                   "rebalance (no replica, one expert per group), then kept; {:.0f} of {} experts "
                   "per layer re-homed at EP={}.\n\n",
                   v.g8 ? v.g8->rehomed_experts : 0.0, v.c.num_experts, v.c.pareto_ranks);
}

// 3. The lognormal skew levels: every policy's token straggler and weight bytes.
std::string skews_section(const BalanceView& v) {
  const BalanceConfig& c = v.c;
  std::vector<std::string> header = {"EP", "max/mean"};
  header.insert(header.end(), c.sim.policies.begin(), c.sim.policies.end());
  md::Table t(header);
  for (int ranks : c.ranks) {
    for (double skew : c.skews) {
      const BalanceGroup* g = v.r.find(ranks, skew);
      if (!g) continue;
      std::vector<std::string> row = {fmt::format("{}", ranks), fmt::format("{}", skew)};
      for (const std::string& p : c.sim.policies) {
        const BalanceCell* cl = g->find(p);
        row.push_back(cl ? fmt::format("{} / {}", pct(cl->summary.token_straggler, g->mean_rows),
                                       mib(cl->summary.weight_bytes_per_step))
                         : "-");
      }
      t.add(std::move(row));
    }
  }
  return "## 3. Lognormal skew levels: token straggler (% of mean) / weights MiB per step\n\n" +
         t.str();
}

// 4. The token-straggler / weight-bytes Pareto front at the Pareto EP size.
std::string pareto_section(const BalanceView& v) {
  const BalanceGroup& g8 = *v.g8;
  const std::vector<uint8_t> front = pareto_front(g8);
  const std::vector<uint8_t> front_contiguous = pareto_front(g8, true);
  std::vector<size_t> order(g8.cells.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return g8.cells[a].summary.weight_bytes_per_step < g8.cells[b].summary.weight_bytes_per_step;
  });
  md::Table t({"setting", "weights MiB/step", "S_T (% of mean)", "S_G ms", "token copies MiB",
               "front", "front, contiguous homes"});
  for (size_t i : order) {
    const BalanceCell& cl = g8.cells[i];
    const bool oracle = cl.policy == "oracle";
    t.add({cl.label, mib(cl.summary.weight_bytes_per_step),
           pct(cl.summary.token_straggler, g8.mean_rows),
           fmt::format("{:.3f}", cl.summary.gemm_straggler_ms),
           mib(cl.summary.token_bytes_per_step),
           oracle     ? "(yardstick)"
           : front[i] ? "**yes**"
                      : "",
           oracle || cl.placed   ? ""
           : front_contiguous[i] ? "**yes**"
                                 : ""});
  }
  return fmt::format(
             "## 4. Pareto: token straggler against weight bytes (EP={}, real priors)\n\n"
             "Every policy and variants of its main knob on the same traces. 'front': no runtime "
             "setting (the oracle is a yardstick) has both fewer weight bytes and a lower "
             "straggler.\n\n",
             v.c.pareto_ranks) +
         t.str();
}

// 5. feplb against each anchor's straggler within the anchor's weight bytes.
std::string targets_section(const BalanceView& v) {
  const BalanceGroup& g8 = *v.g8;
  const Knobs& k = v.c.sim.knobs;
  const BalanceCell& fe = cell(g8, "feplb");
  const double tol = kTargetShare * g8.mean_rows;
  md::Table t({"anchor", "anchor: S_T, weights", "feplb default",
               "best feplb within the "
               "anchor's bytes",
               "same, placed homes"});
  for (const char* anchor : {"eplb", "llep", "moonep"}) {
    if (!g8.find(anchor)) continue;
    const BalanceCell& a = cell(g8, anchor);
    const double aw = a.summary.weight_bytes_per_step, as = a.summary.token_straggler;
    const auto judged = [&](const BalanceCell* f) -> std::string {
      if (!f) return "none moves so little";
      return point(*f, g8.mean_rows) + ": " +
             md::verdict(f->summary.token_straggler <= as + tol &&
                         f->summary.weight_bytes_per_step <= aw);
    };
    t.add({anchor, fmt::format("{}, {} MiB", pct(as, g8.mean_rows), mib(aw)), judged(&fe),
           judged(best_feplb_within(g8, aw, false)), judged(best_feplb_within(g8, aw, true))});
  }
  std::string out = fmt::format(
      "## 5. The targets (EP={}, real priors)\n\nTarget: feplb's token straggler within 2% of "
      "the mean load ({:.0f} rows) of the anchor's, moving no more weight bytes per "
      "micro-batch.\n\n",
      v.c.pareto_ranks, tol);
  out += t.str();
  const BalanceCell* e = g8.find("eplb");
  if (!e) return out;
  const double per_replan = e->summary.weight_bytes_per_step * static_cast<double>(k.eplb_interval);
  return out + fmt::format(
                   "EPLB re-lays out {:.0f} of {} slots' weights per replan ({:.1f} GiB at EP={}), "
                   "here every {} micro-batches; replanned every {:.0f} or more, it moves fewer "
                   "bytes per micro-batch than feplb's default.\n\n",
                   per_replan / static_cast<double>(v.c.sim.shape.weight_bytes()),
                   v.c.num_experts + k.eplb_redundant_per_gpu * v.c.pareto_ranks,
                   per_replan / (kMiB * 1024), v.c.pareto_ranks, k.eplb_interval,
                   fe.summary.weight_bytes_per_step > 0
                       ? std::ceil(per_replan / fe.summary.weight_bytes_per_step)
                       : 0.0);
}

// 6. Across nodes: the floor between nodes and each policy's traffic on the network.
std::string across_nodes_section(const BalanceView& v) {
  const BalanceGroup& gx = *v.gx;
  md::Table t({"policy", "S_T (% of mean)", "floor between nodes (% of mean)",
               "rows above the floor", "balancing MiB/step: NVLink / network",
               "copies fit the window"});
  for (const BalanceCell& cl : gx.cells) {
    if (cl.variant) continue;
    const PolicySummary& s = cl.summary;
    t.add({cl.label, pct(s.token_straggler, gx.mean_rows), pct(cl.oracle_straggler, gx.mean_rows),
           fmt::format("{:.0f}", s.token_straggler - cl.oracle_straggler),
           mib(s.nvlink_bytes_per_step) + " / " + mib(s.network_bytes_per_step),
           fmt::format("{:.0f}%", s.fits_static_window * 100)});
  }
  return fmt::format(
             "## 6. Across nodes: EP={} over {} nodes of {} GPUs (real priors)\n\n"
             "The floor is max over nodes of (node rows / GPUs) - mean: no balancing inside the "
             "nodes goes below it. Placed homes lower it; MoonEP needs one NVLink domain and is "
             "modelled with its copies on the network.\n\n",
             gx.ranks, gx.domains, gx.ranks / gx.domains) +
         t.str();
}

// Section 7's rows against the policies that beat feplb on fewer GPUs or across nodes.
void lost_elsewhere(const BalanceView& v, md::Table& t) {
  if (v.gx && v.gx->find("feplb")) {
    const BalanceGroup& gx = *v.gx;
    const BalanceCell& fx = cell(gx, "feplb");
    for (const char* a : {"eplb", "moonep"}) {
      const BalanceCell* ac = gx.find(a);
      if (!ac || ac->summary.token_straggler >= fx.summary.token_straggler) continue;
      t.add({fmt::format("{}, across nodes (EP={})", a, gx.ranks),
             pct(fx.summary.token_straggler, gx.mean_rows),
             pct(ac->summary.token_straggler, gx.mean_rows),
             fmt::format("{} MiB/step of balancing on the network",
                         mib(ac->summary.network_bytes_per_step))});
    }
  }
  const BalanceGroup* g2 = v.r.find(2, 0.0);
  if (!g2 || !g2->find("feplb")) return;
  for (const char* a : {"moonep", "oracle"}) {
    const BalanceCell* ac = g2->find(a);
    if (!ac || ac->summary.token_straggler >= cell(*g2, "feplb").summary.token_straggler) continue;
    t.add({fmt::format("{}, EP=2", a),
           pct(cell(*g2, "feplb").summary.token_straggler, g2->mean_rows),
           pct(ac->summary.token_straggler, g2->mean_rows),
           a == std::string("oracle") ? "a yardstick" : "as above"});
  }
}

// 7. Where feplb loses, and what the other policy pays for it.
std::string loses_section(const BalanceView& v) {
  const BalanceGroup& g8 = *v.g8;
  const BalanceCell& fe = cell(g8, "feplb");
  md::Table t({"against", "feplb", "the other", "what the other pays"});
  if (const BalanceCell* mo = g8.find("moonep")) {
    t.add({"moonep, balance",
           fmt::format("{}, S_G {:.3f} ms", pct(fe.summary.token_straggler, g8.mean_rows),
                       fe.summary.gemm_straggler_ms),
           fmt::format("{}, S_G {:.3f} ms", pct(mo->summary.token_straggler, g8.mean_rows),
                       mo->summary.gemm_straggler_ms),
           fmt::format("{} SMs held; its plan before the dispatch; one NVLink domain",
                       mo->movement.balance_sms)});
    t.add({"moonep, balancing NVLink MiB/step", mib(fe.summary.nvlink_bytes_per_step),
           mib(mo->summary.nvlink_bytes_per_step), "rows go in its dispatch instead of copies"});
  }
  if (const BalanceCell* ll = g8.find("llep")) {
    const BalanceCell* within = best_feplb_within(g8, ll->summary.weight_bytes_per_step, false);
    t.add({"llep, weight bytes", within ? point(*within, g8.mean_rows) : "nothing within its bytes",
           point(*ll, g8.mean_rows),
           fmt::format("stops at its cap ({:.0f}% above the mean)",
                       (v.c.sim.knobs.llep_cap_factor - 1) * 100)});
  }
  lost_elsewhere(v, t);
  return "## 7. Where feplb loses\n\n" + t.str();
}

}  // namespace

std::string format_balance_markdown(const BalanceResult& r, const std::string& command,
                                    const std::string& plot_dir) {
  const BalanceConfig& c = r.config;
  BalanceView v{r, c, r.find(c.pareto_ranks, 0.0), nullptr};
  for (const BalanceGroup& g : r.groups) {
    if (g.skew == 0 && g.domains > 1) v.gx = &g;
  }
  const bool feplb_at_8 = v.g8 && v.g8->find("feplb");
  std::string out = header(v, command, plot_dir);
  out += policies_section(v);
  out += anchors_section(v);
  out += real_priors_section(v);
  if (!c.skews.empty()) out += skews_section(v);
  if (v.g8) out += pareto_section(v);
  if (feplb_at_8) out += targets_section(v);
  if (v.gx && v.gx->find("feplb")) out += across_nodes_section(v);
  if (feplb_at_8) out += loses_section(v);
  out +=
      "Not modelled (each favours some policy): dispatch and combine time and the SMs they take "
      "from the GEMMs; the anchors' plans on the critical path before their dispatch; EPLB's "
      "replica re-sync after every optimizer step; NCCL's real SM count; MoonEP's token "
      "padding; copy-engine bandwidth under contention with the dispatch.\n";
  return out + many_donor_section(r);
}

}  // namespace feplb
