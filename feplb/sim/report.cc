#include "feplb/sim/report.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "feplb/core/error.h"
#include "feplb/core/text.h"
#include "feplb/sim/internal/report_parts.h"
#include "feplb/sim/internal/report_util.h"
#include "feplb/sim/svg.h"

namespace feplb {
namespace {

std::string change_pct(double reduction) { return fmt::format("{:+.0f}%", -reduction * 100.0); }

// Lines about the homes, for the table's header: where they come from, the walk-forward replans
// and what they moved, and the imbalance left between nodes. Empty: contiguous homes, one node.
std::string format_placement_lines(const SimulationResult& r, double mean_rows) {
  std::string out;
  const SimulationConfig& c = r.config;
  if (!r.replans.empty()) {
    double rehomed = 0, later = 0, across = 0, place_ms = 0, bytes = 0;
    for (size_t i = 0; i < r.replans.size(); ++i) {
      const Migration& m = r.replans[i].migration;
      rehomed += static_cast<double>(m.rehomed_experts);
      across += static_cast<double>(m.across_nodes);
      if (i > 0) later += static_cast<double>(m.rehomed_experts);
      place_ms += r.replans[i].place_ms;
      bytes += static_cast<double>(m.total_bytes());
    }
    const auto n = static_cast<double>(r.replans.size());
    const auto layers = static_cast<double>(std::max<size_t>(1, r.final_placement.layers.size()));
    out += fmt::format(
        "walk-forward: homes and dynamic sets replanned every {} micro-batches from the previous "
        "{} ({} replans, {:.1f} ms each); experts re-homed per replan and layer: {:.1f} ({:.1f} "
        "to another node), first {:.1f}, later {:.1f}\n"
        "migration (weights + optimizer state, {:.0f} bytes/param): {:.1f} GiB in all = {:.0f} MiB "
        "per step\n",
        c.replan_interval, c.replan_window > 0 ? c.replan_window : c.replan_interval,
        r.replans.size(), place_ms / n, rehomed / n / layers, across / n / layers,
        static_cast<double>(r.replans.front().migration.rehomed_experts) / layers,
        n > 1 ? later / (n - 1) / layers : 0.0, c.knobs.optimizer_bytes_per_param,
        bytes / (kMiB * 1024.0), r.migration_bytes_per_step() / kMiB);
  } else if (!r.final_placement.empty()) {
    out += "homes and dynamic sets: from the placement file, for every policy\n";
  }
  if (!r.final_placement.empty()) {
    out +=
        fmt::format("dynamic sets: feplb --feplb-dyn-set {} ({}), feplb-paper --paper-dyn-set {}\n",
                    c.knobs.feplb_dyn_set,
                    c.knobs.feplb_dyn_set ? "the placement's" : "per micro-batch from the counts",
                    c.knobs.paper_dyn_set);
  }
  if (r.topo.num_domains() > 1 && !r.policies.empty()) {
    const double floor = r.policies.front().summary.inter_node_floor;
    out += fmt::format(
        "between nodes: {:.0f} rows per GPU ({:.2f}% of the mean) that no in-node balancing can "
        "remove (mean in-domain floor)\n",
        floor, mean_rows > 0 ? floor / mean_rows * 100.0 : 0.0);
  }
  return out.empty() ? out : out + "\n";
}

}  // namespace

nlohmann::ordered_json data_movement_json(const DataMovement& m) {
  return {{"dispatch", m.dispatch},
          {"dispatch_sms", m.dispatch_sms},
          {"balance", m.balance},
          {"balance_sms", m.balance_sms},
          {"balance_every_micro_batch", m.balance_every_micro_batch}};
}

nlohmann::ordered_json gpu_json(const SimulationConfig& c) {
  const GpuClass& g = find_gpu_class(c.gpu);
  return {{"class", g.name},
          {"device", g.device},
          {"measured", g.measured},
          {"provenance", g.provenance()},
          {"source", g.source},
          {"copy_gbps", c.knobs.copy_gbps},
          {"internode_gbps", c.knobs.internode_gbps},
          {"gemm_peak_tflops", c.knobs.gemm_peak_tflops},
          {"hbm_gbps", c.knobs.hbm_gbps},
          {"num_sms", c.knobs.num_sms}};
}

size_t worst_static_step(const SimulationResult& r) {
  const PolicyResult* base = r.find("static");
  FEPLB_CHECK(base != nullptr && !base->steps.empty(), "no static policy in the result");
  size_t worst = 0;
  for (size_t i = 1; i < base->steps.size(); ++i) {
    if (base->steps[i].token_straggler > base->steps[worst].token_straggler) worst = i;
  }
  return worst;
}

std::string format_table(const SimulationResult& r) {
  const auto& first = r.policies.front().steps;
  double mean_rows = 0;
  for (const StepMetrics& m : first) mean_rows += m.mean_rows / static_cast<double>(first.size());
  std::string out = fmt::format(
      "{} | {} steps | {} | {} | top-{} x {} tokens/GPU = {:.0f} rows/GPU on average\n"
      "{}; GEMM model: {}\n"
      "fits window: steps in which no GPU waited for a copy (each landed before its receiver ran "
      "out of work whose copies had landed);\n"
      "delays: steps the balancing made slower: a late copy held up the slowest GPU, or (one-hop) "
      "the plan ran before the dispatch;\n"
      "exposed: how much slower (mean ms); a GPU that waits for a copy but still finishes before "
      "the slowest one costs nothing;\n"
      "prefetch: weights copied before routing (within {:.0f} us of earlier work), MiB/step, and "
      "the share a slice used\n\n",
      r.model.empty() ? "(unnamed model)" : printable(r.model), first.size(), r.topo.describe(),
      r.config.shape.describe(), r.top_k, r.tokens_per_rank, mean_rows,
      describe_gpu(find_gpu_class(r.config.gpu), r.config.knobs), r.config.cost_label,
      r.config.knobs.prefetch_window_us);
  out += format_placement_lines(r, mean_rows);
  out += fmt::format(
      "{:<12} {:>17} {:>9} {:>7} {:>17} {:>7} {:>9} {:>9} {:>12} {:>7} {:>7} {:>8} {:>13}\n",
      "policy", "token straggler", "max/mean", "vs st.", "GEMM straggler", "vs st.", "weights",
      "tokens", "prefetch", "fits", "delays", "exposed", "planner us");
  out += fmt::format(
      "{:<12} {:>17} {:>9} {:>7} {:>17} {:>7} {:>9} {:>9} {:>12} {:>7} {:>7} {:>8} {:>13}\n", "",
      "mean (p95) rows", "mean", "", "mean (p95) ms", "", "MiB/step", "MiB/step", "MiB (hit)",
      "window", "layer", "ms", "median / p99");
  for (const PolicyResult& p : r.policies) {
    const PolicySummary& s = p.summary;
    const std::string prefetch =
        s.prefetch_bytes_per_step > 0
            ? fmt::format("{:.0f} ({:.0f}%)", s.prefetch_bytes_per_step / kMiB,
                          s.prefetch_hit_rate * 100.0)
            : "-";
    out += fmt::format(
        "{:<12} {:>17} {:>9.3f} {:>7} {:>17} {:>7} {:>9.0f} {:>9.1f} {:>12} {:>6.0f}% {:>6.0f}% "
        "{:>8.3f} {:>13}\n",
        p.name, fmt::format("{:.0f} ({:.0f})", s.token_straggler, s.token_straggler_p95),
        s.token_max_over_mean, p.name == "static" ? "" : change_pct(s.token_straggler_reduction),
        fmt::format("{:.3f} ({:.3f})", s.gemm_straggler_ms, s.gemm_straggler_ms_p95),
        p.name == "static" ? "" : change_pct(s.gemm_straggler_reduction),
        s.weight_bytes_per_step / kMiB, s.token_bytes_per_step / kMiB, prefetch,
        s.fits_static_window * 100.0, s.delayed_steps * 100.0, s.exposed_ms,
        fmt::format("{:.1f} / {:.1f}", s.planner_us_median, s.planner_us_p99));
  }
  // The modes a policy planned in (feplb's chooser), and how often.
  for (const PolicyResult& p : r.policies) {
    if (p.summary.modes.empty()) continue;
    std::string line;
    for (const auto& [mode, count] : p.summary.modes) {
      line += fmt::format("{}{} ({} of {} steps)", line.empty() ? "" : "; ", mode, count,
                          p.steps.size());
    }
    out += fmt::format("{} planned in: {}\n", p.name, line);
  }
  return out;
}

namespace {

using ojson = nlohmann::ordered_json;

// The walk-forward placement's replans (or the file's placement) of a simulation.
ojson placement_json(const SimulationResult& r) {
  const SimulationConfig& c = r.config;
  ojson replans = ojson::array();
  for (const Replan& rp : r.replans) {
    ojson layers = ojson::array();
    for (const LayerPlaceStats& l : rp.layers) {
      layers.push_back({{"layer", l.layer},
                        {"rehomed_experts", l.rehomed},
                        {"node_swaps", l.node_swaps},
                        {"gpu_swaps", l.gpu_swaps},
                        {"history_between_nodes_before", l.before.node_floor},
                        {"history_between_nodes_after", l.after.node_floor},
                        {"history_rows_above_node_mean_before", l.before.gpu_excess},
                        {"history_rows_above_node_mean_after", l.after.gpu_excess}});
    }
    const Migration& m = rp.migration;
    replans.push_back({{"micro_batch", rp.micro_batch},
                       {"history_micro_batches", rp.history_micro_batches},
                       {"rehomed_experts", m.rehomed_experts},
                       {"rehomed_across_nodes", m.across_nodes},
                       {"weight_bytes", m.weight_bytes},
                       {"optimizer_bytes", m.optimizer_bytes},
                       {"network_bytes", m.network_bytes},
                       {"place_ms", rp.place_ms},
                       {"layers", layers}});
  }
  return {{"source", r.replans.empty() ? "file" : "walk-forward"},
          {"replan_interval", c.replan_interval},
          {"replan_window", c.replan_window > 0 ? c.replan_window : c.replan_interval},
          {"migration_bytes_per_step", r.migration_bytes_per_step()},
          {"replans", replans}};
}

ojson config_json(const SimulationResult& r) {
  const SimulationConfig& c = r.config;
  ojson knobs = ojson::object();
  Knobs k = c.knobs;
  for (const KnobInfo& info : list_knobs(k)) {
    std::visit([&](auto* p) { knobs[std::string(info.name)] = *p; }, info.value);
  }
  ojson config = {
      {"trace", c.trace_label},
      {"model", r.model},
      {"num_experts", r.topo.num_experts()},
      {"top_k", r.top_k},
      {"num_ranks", r.topo.num_ranks()},
      {"tokens_per_rank", r.tokens_per_rank},
      {"steps", r.step_ids.size()},
      {"warmup_steps", c.warmup_steps},
      {"gpus_per_node", c.gpus_per_node},
      {"nvlink_domains", r.topo.num_domains()},
      {"expert_shape",
       {{"hidden", c.shape.hidden},
        {"ffn", c.shape.ffn},
        {"dtype", dtype_name(c.shape.dtype)},
        {"weight_bytes", c.shape.weight_bytes()}}},
      {"gpu", gpu_json(c)},
      {"cost_model", c.cost_label},
      {"policies", c.policies},
      {"knobs", knobs},
  };
  if (!r.final_placement.empty()) config["placement"] = placement_json(r);
  return config;
}

// One policy's summary, transport and (feplb) modes.
ojson policy_json(const PolicyResult& p) {
  const PolicySummary& s = p.summary;
  ojson j = {
      {"token_straggler", s.token_straggler},
      {"token_straggler_p95", s.token_straggler_p95},
      {"token_max_over_mean", s.token_max_over_mean},
      {"token_max_over_mean_p95", s.token_max_over_mean_p95},
      {"gemm_straggler_ms", s.gemm_straggler_ms},
      {"gemm_straggler_ms_p95", s.gemm_straggler_ms_p95},
      {"weight_bytes_per_step", s.weight_bytes_per_step},
      {"token_bytes_per_step", s.token_bytes_per_step},
      {"guest_experts_per_step", s.guest_experts_per_step},
      {"fits_static_window", s.fits_static_window},
      {"window_slack_ms_p5", s.window_slack_ms_p5},
      {"copy_exposed_ms", s.copy_exposed_ms},
      {"copy_exposed_ms_p95", s.copy_exposed_ms_p95},
      {"plan_exposed_ms", s.plan_exposed_ms},
      {"exposed_ms", s.exposed_ms},
      {"exposed_ms_p95", s.exposed_ms_p95},
      {"delayed_steps", s.delayed_steps},
      {"prefetch_bytes_per_step", s.prefetch_bytes_per_step},
      {"prefetch_wasted_bytes_per_step", s.prefetch_wasted_bytes_per_step},
      {"prefetch_hit_rate", s.prefetch_hit_rate},
      {"prefetch_coverage", s.prefetch_coverage},
      {"planner_us_median", s.planner_us_median},
      {"planner_us_p99", s.planner_us_p99},
      {"token_straggler_reduction", s.token_straggler_reduction},
      {"gemm_straggler_reduction", s.gemm_straggler_reduction},
      {"above_oracle_pct_of_mean", s.above_oracle_pct_of_mean},
      {"inter_node_floor", s.inter_node_floor},
      {"nvlink_bytes_per_step", s.nvlink_bytes_per_step},
      {"network_bytes_per_step", s.network_bytes_per_step},
      {"dispatch_nvlink_bytes_per_step", s.dispatch_nvlink_bytes_per_step},
      {"dispatch_network_bytes_per_step", s.dispatch_network_bytes_per_step},
      {"guest_slots_max", s.guest_slots_max},
      {"transport", data_movement_json(p.movement)},
  };
  // Each measured step, in order: what the summary above aggregates.
  ojson steps = ojson::array();
  for (const StepMetrics& m : p.steps) {
    steps.push_back({{"token_straggler", m.token_straggler},
                     {"gemm_straggler_ms", m.gemm_straggler_ms},
                     {"exposed_ms", m.exposed_ms()},
                     {"planner_us", m.planner_us}});
  }
  j["steps"] = steps;
  if (s.modes.empty()) return j;
  ojson modes = ojson::object();
  for (const auto& [mode, count] : s.modes) modes[mode] = count;
  ojson per_step = ojson::array();
  for (const StepMetrics& m : p.steps) per_step.push_back(m.mode);
  j["modes"] = modes;
  j["step_modes"] = per_step;  // in the order of the measured steps
  return j;
}

}  // namespace

std::string format_json(const SimulationResult& r) {
  ojson doc;
  doc["config"] = config_json(r);
  ojson policies = ojson::object();
  for (const PolicyResult& p : r.policies) policies[p.name] = policy_json(p);
  doc["policies"] = policies;
  return doc.dump(2) + "\n";
}

namespace {

// The per-GPU-rows plot's title and legend.
void rows_title(Svg& svg, const SimulationResult& r, size_t worst, double gap) {
  const auto [step_id, layer_id] = r.step_ids[worst];
  svg.text(gap, 28,
           fmt::format("Token-expert rows per GPU, step {} layer {} (the step where static is "
                       "worst)",
                       step_id, layer_id),
           18, "start", "#222", true);
  svg.text(gap, 47,
           fmt::format("{} | {} | top-{}, {} tokens/GPU", r.model, r.topo.describe(), r.top_k,
                       r.tokens_per_rank),
           12, "start", "#444");
  // The legend, one entry after another (about 6.7 px per character at 12 px).
  double lx = gap;
  for (const auto& [color, label] : std::vector<std::pair<const char*, const char*>>{
           {colors::kOwnRows, "rows of the GPU's own experts"},
           {colors::kGuestRows, "guest rows it computes for other GPUs"},
           {nullptr, "mean rows per GPU"}}) {
    if (color) {
      svg.rect(lx, 54, 10, 10, color);
    } else {
      svg.line(lx, 59, lx + 22, 59, colors::kMean, 1.5, "5,3");
      lx += 12;
    }
    svg.text(lx + 14, 63, label, 12, "start", "#444");
    lx += 14 + 6.7 * static_cast<double>(std::string_view(label).size()) + 24;
  }
}

// Where one policy's panel of per-GPU rows sits, and its scale.
struct RowsPanel {
  double x0, y0, pw, ph, ymax, ystep, mean;
};

// One policy's panel: per-GPU own and guest rows at step `worst`, stacked, the mean dashed.
void rows_panel(Svg& svg, const SimulationResult& r, const PolicyResult& p, size_t worst,
                const RowsPanel& a) {
  const int R = r.topo.num_ranks();
  const double plot_h = a.ph - 50, base_y = a.y0 + 30 + plot_h;
  const double bw = (a.pw - 20) / R;
  const StepMetrics& m = p.steps[worst];
  svg.text(a.x0, a.y0 + 14, p.name, 13, "start", policy_color(p.name), true);
  svg.text(a.x0, a.y0 + 27,
           fmt::format("S_T {:.0f} rows ({:.3f}x mean), {:.0f} MiB moved", m.token_straggler,
                       m.token_max_over_mean, static_cast<double>(m.weight_bytes) / kMiB),
           11, "start", "#444");
  // The y scale: rows, with a light grid.
  for (double v = 0; v <= a.ymax * 1.0001; v += a.ystep) {
    const double y = base_y - plot_h * v / a.ymax;
    if (v > 0) svg.line(a.x0, y, a.x0 + a.pw - 10, y, "#eeeeee");
    svg.text(a.x0 - 4, y + 3.5, fmt::format("{:.0f}", v), 9, "end", "#666");
  }
  svg.line(a.x0, base_y - plot_h, a.x0, base_y, "#999999");
  svg.line(a.x0, base_y, a.x0 + a.pw - 10, base_y, "#999999");
  for (int g = 0; g < R; ++g) {
    const auto home = static_cast<double>(p.loads[worst].home_rows[g]);
    const auto guest = static_cast<double>(p.loads[worst].guest_rows[g]);
    const double home_h = plot_h * home / a.ymax, guest_h = plot_h * guest / a.ymax;
    const double bx = a.x0 + 5 + g * bw;
    svg.rect(bx, base_y - home_h, bw * 0.8, home_h, colors::kOwnRows,
             fmt::format("GPU {}: {:.0f} own rows", g, home));
    if (guest_h > 0) {
      svg.rect(bx, base_y - home_h - guest_h, bw * 0.8, guest_h, colors::kGuestRows,
               fmt::format("GPU {}: {:.0f} guest rows", g, guest));
    }
    if (R <= 16) svg.text(bx + bw * 0.4, base_y + 11, fmt::format("{}", g), 9, "middle", "#666");
  }
  const double mean_y = base_y - plot_h * a.mean / a.ymax;
  svg.line(a.x0, mean_y, a.x0 + a.pw - 10, mean_y, colors::kMean, 1.5, "5,3");
}

// Token straggler over the steps, one line per policy, in the box from (lx0, ly0), `lw` wide and
// `line_h` high. Zero sits a few pixels above the x axis so that a policy at 0 (the oracle) stays
// visible.
void straggler_lines(Svg& svg, const SimulationResult& r, double gap, double lx0, double ly0,
                     double lw, double line_h) {
  const double lh = line_h - 60, lift = 5;
  double smax = 1.0;
  for (const PolicyResult& p : r.policies) {
    for (const StepMetrics& sm : p.steps) smax = std::max(smax, sm.token_straggler);
  }
  const auto [saxis, sstep] = nice_axis(smax);
  const double axis_y = ly0 + 10 + lh;
  const auto map_y = [&](double v) { return axis_y - lift - (lh - lift) * v / saxis; };
  svg.text(gap, ly0 - 8, "Token straggler (max - mean rows per GPU) at every step", 14, "start",
           "#222", true);
  for (double v = 0; v <= saxis * 1.0001; v += sstep) {
    if (v > 0) svg.line(lx0, map_y(v), lx0 + lw, map_y(v), "#eeeeee");
    svg.text(lx0 - 4, map_y(v) + 3, fmt::format("{:.0f}", v), 10, "end", "#666");
  }
  svg.line(lx0, ly0 + 10, lx0, axis_y, "#999999");
  svg.line(lx0, axis_y, lx0 + lw, axis_y, "#999999");
  const size_t nsteps = r.step_ids.size();
  for (size_t i = 0; i < r.policies.size(); ++i) {
    const PolicyResult& p = r.policies[i];
    std::vector<std::pair<double, double>> pts;
    for (size_t j = 0; j < nsteps; ++j) {
      const double x =
          lx0 +
          (nsteps > 1 ? lw * static_cast<double>(j) / static_cast<double>(nsteps - 1) : lw / 2);
      pts.emplace_back(x, map_y(p.steps[j].token_straggler));
    }
    const char* color = policy_color(p.name);
    const double row = static_cast<double>(i) * 16;
    svg.polyline(pts, color, 1.5);
    svg.line(lx0 + lw + 12, ly0 + 22 + row, lx0 + lw + 24, ly0 + 22 + row, color, 3);
    svg.text(lx0 + lw + 28, ly0 + 26 + row,
             fmt::format("{} (mean {:.0f})", p.name, p.summary.token_straggler), 11);
  }
  svg.text(lx0 + lw / 2, axis_y + 16, "trace step (micro-batch x layer)", 10, "middle", "#666");
}

}  // namespace

// Top: one panel per policy, per-GPU rows at the step where static is worst (own experts' rows
// and guest rows stacked, the mean dashed), on one y scale. Bottom: token straggler over the
// steps, one line per policy in its colour. The bar colours and the mean line's are used for
// nothing else.
std::string plot_svg(const SimulationResult& r) {
  const size_t worst = worst_static_step(r);
  const int R = r.topo.num_ranks();
  const int n = static_cast<int>(r.policies.size());
  const int cols = std::min(n, 3), rows = (n + cols - 1) / cols;
  const double pw = 330, ph = 220, top = 80, gap = 30, axis_w = 44;
  const double line_h = 260;
  const double width = cols * (pw + axis_w) + (cols + 1) * gap;
  const double height = top + rows * (ph + gap) + line_h + 80;
  int64_t most = 1;
  for (const PolicyResult& p : r.policies) {
    for (int g = 0; g < R; ++g) {
      most = std::max(most, p.loads[worst].home_rows[g] + p.loads[worst].guest_rows[g]);
    }
  }
  const auto [ymax, ystep] = nice_axis(static_cast<double>(most));
  const double mean = r.policies.front().steps[worst].mean_rows;
  Svg svg(width, height);
  rows_title(svg, r, worst, gap);
  for (int i = 0; i < n; ++i) {
    const RowsPanel panel{gap + axis_w + (i % cols) * (pw + axis_w + gap),
                          top + (i / cols) * (ph + gap),
                          pw,
                          ph,
                          ymax,
                          ystep,
                          mean};
    rows_panel(svg, r, r.policies[i], worst, panel);
  }
  const double lx0 = gap + 50, ly0 = top + rows * (ph + gap) + 30;
  straggler_lines(svg, r, gap, lx0, ly0, width - lx0 - gap - 210, line_h);
  return svg.done();
}

}  // namespace feplb
