// The SVG plots of docs/results/balance.md (helpers in svg_plot.h): token straggler, GEMM
// straggler and weight bytes against EP size and skew; the Pareto plot of straggler against
// weight bytes; the cross-node picture at the largest EP size.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "feplb/sim/balance.h"
#include "feplb/sim/internal/report_util.h"
#include "feplb/sim/svg.h"
#include "feplb/sim/svg_plot.h"

namespace feplb {
namespace {

using svg::color_of;
using svg::legend;
using svg::line_panel;
using svg::LogAxis;
using svg::nice_axis;
using svg::Series;
using svg::Svg;
using svg::tick_label;
using svg::y_log_ticks;
constexpr double kNan = svg::kNan;

// Labels drawn as lines: the main policies, then feplb with placed homes.
std::vector<std::pair<std::string, const char*>> line_labels(const BalanceResult& r) {
  std::vector<std::pair<std::string, const char*>> out;
  for (const std::string& p : r.config.sim.policies) out.emplace_back(p, "");
  out.emplace_back("feplb, placed homes", "5,3");
  return out;
}

const char* policy_of_label(const std::string& label) {
  for (const char* p :
       {"feplb-paper", "feplb", "static", "fastermoe", "oracle", "eplb", "llep", "moonep"}) {
    const std::string s = p;
    if (label == s || label.rfind(s + ",", 0) == 0 || label.rfind(s + " ", 0) == 0) return p;
  }
  return "";
}

// Two panels: real priors against EP size, lognormal skews at the Pareto EP size.
template <typename Value>
std::string two_panel_plot(const BalanceResult& r, const std::string& title,
                           const std::string& subtitle, const LogAxis& y, const std::string& unit,
                           const Value& value) {
  const BalanceConfig& c = r.config;
  const double pw = 440, ph = 330, gap = 20, legend_w = 190;
  Svg svg(2 * pw + 3 * gap + legend_w, ph + 70);
  svg.text(gap, 24, title, 17, "start", "#222", true);
  svg.text(gap, 42, subtitle, 11, "start", "#555");
  const auto labels = line_labels(r);
  std::vector<Series> real, skew;
  std::vector<std::string> ep_labels, skew_labels;
  for (int ranks : c.ranks)
    ep_labels.push_back(fmt::format(
        "{}{}", ranks, r.find(ranks, 0.0) && r.find(ranks, 0.0)->domains > 1 ? " (2 nodes)" : ""));
  for (double s : c.skews) skew_labels.push_back(fmt::format("{}", s));
  for (const auto& [label, dash] : labels) {
    Series a{label, policy_color(policy_of_label(label)), dash, {}}, b = a;
    for (int ranks : c.ranks) {
      const BalanceGroup* g = r.find(ranks, 0.0);
      const BalanceCell* cl = g ? g->find(label) : nullptr;
      a.values.push_back(cl ? value(*g, *cl) : kNan);
    }
    for (double s : c.skews) {
      const BalanceGroup* g = r.find(c.pareto_ranks, s);
      const BalanceCell* cl = g ? g->find(label) : nullptr;
      b.values.push_back(cl ? value(*g, *cl) : kNan);
    }
    real.push_back(a);
    skew.push_back(b);
  }
  line_panel(svg, gap, 55, pw, ph, "Real priors (pooled), by EP size", "EP size", ep_labels, real,
             y, unit);
  if (!c.skews.empty()) {
    line_panel(svg, 2 * gap + pw, 55, pw, ph, fmt::format("Lognormal skew, EP={}", c.pareto_ranks),
               "max/mean expert popularity", skew_labels, skew, y, unit);
  }
  legend(svg, 3 * gap + 2 * pw, 95, real);
  return svg.done();
}

// The Pareto plot's frame: where its points go, on log axes (0 drawn at '0').
struct ParetoFrame {
  const BalanceGroup& g;
  double left, right, top, bottom;
  LogAxis x, y;
  double px(const BalanceCell& c) const { return x.map(c.summary.weight_bytes_per_step / kMiB); }
  double py(const BalanceCell& c) const {
    return y.map(c.summary.token_straggler / g.mean_rows * 100);
  }
};

void pareto_axes(Svg& svg, const ParetoFrame& f) {
  y_log_ticks(svg, f.y, f.left, f.right, "%");
  for (double v = f.x.lo; v <= f.x.hi * 1.0001; v *= 10) {
    const double px = f.x.map(v);
    svg.line(px, f.top, px, f.bottom, "#e6e6e6");
    svg.text(px, f.bottom + 14, tick_label(v, ""), 10, "middle", "#555");
  }
  svg.text(f.x.zero(), f.bottom + 14, "0", 10, "middle", "#555");
  svg.line(f.left, f.bottom, f.right, f.bottom, "#999");
  svg.line(f.left, f.top, f.left, f.bottom, "#999");
  svg.text((f.left + f.right) / 2, f.bottom + 34,
           "expert weight bytes moved per micro-batch and layer (MiB, log)", 11, "middle", "#444");
  svg.text(f.left - 48, f.top - 8, "token straggler, % of mean load (log)", 11, "start", "#444");
}

// The series of variants joined by thin lines (feplb tolerance, placed homes, LLEP's cap) and the
// front as steps; returns the lines drawn (the labels avoid them).
std::vector<std::vector<std::pair<double, double>>> pareto_lines(Svg& svg, const ParetoFrame& f) {
  std::vector<std::vector<std::pair<double, double>>> drawn;
  for (const auto& [prefix, policy] : std::vector<std::pair<std::string, std::string>>{
           {"feplb tol", "feplb"}, {"feplb, placed homes, tol", "feplb"}, {"llep cap", "llep"}}) {
    std::vector<std::pair<double, double>> pts;
    for (const BalanceCell& c : f.g.cells) {
      if (c.label.rfind(prefix, 0) == 0) pts.emplace_back(f.px(c), f.py(c));
    }
    std::sort(pts.begin(), pts.end());
    svg.polyline(pts, policy_color(policy), 1, "2,2");
    drawn.push_back(pts);
  }
  const std::vector<uint8_t> front = pareto_front(f.g);
  std::vector<std::pair<double, double>> fpts;
  for (size_t i = 0; i < f.g.cells.size(); ++i) {
    if (front[i]) fpts.emplace_back(f.px(f.g.cells[i]), f.py(f.g.cells[i]));
  }
  std::sort(fpts.begin(), fpts.end());
  std::vector<std::pair<double, double>> steps;
  for (size_t i = 0; i < fpts.size(); ++i) {
    if (i > 0) steps.emplace_back(fpts[i].first, fpts[i - 1].second);
    steps.push_back(fpts[i]);
  }
  svg.polyline(steps, colors::kFront, 3);
  drawn.push_back(steps);
  return drawn;
}

using Box = std::array<double, 4>;  // x0, y0, x1, y1

// What a label must not cover: the markers, the lines (small boxes every few pixels along each
// segment) and the axes' tick labels.
std::vector<Box> pareto_obstacles(
    const ParetoFrame& f, const std::vector<std::vector<std::pair<double, double>>>& drawn) {
  std::vector<Box> taken;
  for (const BalanceCell& c : f.g.cells) {
    const double rad = c.variant ? 3.5 : 5.5;
    taken.push_back({f.px(c) - rad, f.py(c) - rad, f.px(c) + rad, f.py(c) + rad});
  }
  for (const auto& line : drawn) {
    for (size_t i = 0; i + 1 < line.size(); ++i) {
      const auto [x0, y0] = line[i];
      const auto [x1, y1] = line[i + 1];
      const int n = 1 + static_cast<int>(std::hypot(x1 - x0, y1 - y0) / 4);
      for (int k = 0; k <= n; ++k) {
        const double sx = x0 + (x1 - x0) * k / n, sy = y0 + (y1 - y0) * k / n;
        taken.push_back({sx - 1.5, sy - 1.5, sx + 1.5, sy + 1.5});
      }
    }
  }
  taken.push_back({f.left - 40, f.bottom, f.right + 40, f.bottom + 20});  // x tick labels
  taken.push_back({f.left - 48, f.top - 20, f.left, f.bottom});           // y tick labels
  return taken;
}

// Labels of the main settings. Each takes the first of a list of places around its point (right,
// left, above, below, then further out, with a leader line) whose box stays inside the plot and
// overlaps no other label, no marker and no axis tick label; where none is free, the place that
// overlaps least.
void pareto_labels(Svg& svg, const ParetoFrame& f, std::vector<Box> taken) {
  const auto overlap = [](const Box& a, const Box& b) {
    const double w = std::min(a[2], b[2]) - std::max(a[0], b[0]);
    const double h = std::min(a[3], b[3]) - std::max(a[1], b[1]);
    return w > 0 && h > 0 ? w * h : 0.0;
  };
  struct Place {
    double dx, dy;  // of the text's baseline start from the point
    bool leader;
  };
  for (const BalanceCell& c : f.g.cells) {
    if (c.variant) continue;
    const double w = 6.4 * static_cast<double>(c.label.size()), h = 12;
    const double cx = f.px(c), cy = f.py(c);
    std::vector<Place> places = {
        {8, 4, false}, {-8 - w, 4, false}, {-w / 2, -9, false}, {-w / 2, 17, false}};
    for (double d : {22.0, 36.0, 50.0, 64.0}) {
      places.push_back({8, 4 - d, true});
      places.push_back({8, 4 + d, true});
      places.push_back({-8 - w, 4 - d, true});
      places.push_back({-8 - w, 4 + d, true});
    }
    double best_cost = INFINITY;
    Place best = places.front();
    for (const Place& p : places) {
      const Box box{cx + p.dx, cy + p.dy - h + 2, cx + p.dx + w, cy + p.dy + 2};
      double cost = 0;
      if (box[0] < f.left || box[2] > f.right || box[1] < f.top || box[3] > f.bottom) cost += 1e6;
      for (const Box& t : taken) cost += overlap(box, t);
      if (cost < best_cost) {
        best_cost = cost;
        best = p;
      }
      if (cost == 0) break;
    }
    const char* color = policy_color(policy_of_label(c.label));
    if (best.leader) {
      svg.line(cx, cy, best.dx > 0 ? cx + best.dx - 2 : cx + best.dx + w + 2, cy + best.dy - 4,
               color, 0.7);
    }
    svg.text(cx + best.dx, cy + best.dy, c.label, 11, "start", color);
    taken.push_back({cx + best.dx, cy + best.dy - h + 2, cx + best.dx + w, cy + best.dy + 2});
  }
}

// The legend of the variant series and the front, right of the plot.
void pareto_legend(Svg& svg, double lx, double ly) {
  svg.text(lx, ly, "variants (hollow):", 11, "start", "#222", true);
  for (const auto& [text, policy] : std::vector<std::pair<std::string, std::string>>{
           {"feplb --balance-tolerance 2..20%", "feplb"},
           {"same, placed homes", "feplb"},
           {"eplb: interval 4/16, R 0/2,", "eplb"},
           {"  no duplicates, global", "eplb"},
           {"llep --llep-cap-factor 1.05..1.3", "llep"}}) {
    ly += 17;
    svg.marker(lx + 5, ly - 4, 3.5, policy_color(policy), true, text);
    svg.text(lx + 14, ly, text, 11);
  }
  ly += 26;
  svg.line(lx, ly - 4, lx + 22, ly - 4, colors::kFront, 3);
  svg.text(lx + 28, ly, "Pareto front", 11);
  ly += 22;
  svg.text(lx, ly, "0 on an axis: drawn at '0'", 10, "start", "#666");
}

std::string pareto_plot(const BalanceResult& r) {
  const BalanceGroup* g = r.find(r.config.pareto_ranks, 0.0);
  const double width = 1000, height = 620;
  Svg svg(width, height);
  svg.text(20, 24,
           fmt::format("Token straggler against weight bytes moved, EP={}, real priors",
                       r.config.pareto_ranks),
           17, "start", "#222", true);
  svg.text(20, 42,
           fmt::format("each point: one setting, mean over every step of the {} prior{}; filled: "
                       "default settings, hollow: variants; the line: the Pareto front of runtime "
                       "settings",
                       r.config.prior_paths.size(), r.config.prior_paths.size() == 1 ? "" : "s"),
           11, "start", "#555");
  if (!g) return svg.done();
  const double left = 80, right = width - 230, top = 70, bottom = height - 60;
  const ParetoFrame f{*g,
                      left,
                      right,
                      top,
                      bottom,
                      LogAxis{1, 10000, left + 24, right},
                      LogAxis{0.01, 100, bottom - 26, top}};  // the '0' row 10 px above the axis
  pareto_axes(svg, f);
  const auto drawn = pareto_lines(svg, f);
  for (const BalanceCell& c : g->cells) {
    const bool main = !c.variant;
    const std::string tip = fmt::format("{}: {:.0f} MiB, {:.2f}% of mean", c.label,
                                        c.summary.weight_bytes_per_step / kMiB,
                                        c.summary.token_straggler / g->mean_rows * 100);
    svg.marker(f.px(c), f.py(c), main ? 5.5 : 3.5, policy_color(policy_of_label(c.label)), !main,
               tip);
  }
  pareto_labels(svg, f, pareto_obstacles(f, drawn));
  pareto_legend(svg, right + 20, top + 10);
  return svg.done();
}

// Cross-node: at the largest multi-node EP, each policy's straggler with the floor between nodes,
// and the balancing bytes it puts on the network.
std::string cross_node_plot(const BalanceResult& r) {
  const BalanceGroup* g = nullptr;
  for (const BalanceGroup& x : r.groups) {
    if (x.skew == 0 && x.domains > 1) g = &x;
  }
  const double width = 1000;
  const double rows =
      g ? static_cast<double>(std::count_if(g->cells.begin(), g->cells.end(),
                                            [](const BalanceCell& c) { return !c.variant; }))
        : 1;
  const double bar_h = 20, top = 80, height = top + rows * (bar_h + 8) + 70;
  Svg svg(width, height);
  if (!g) return svg.done();
  svg.text(20, 24,
           fmt::format("Across nodes: EP={} over {} nodes, real priors", g->ranks, g->domains), 17,
           "start", "#222", true);
  svg.text(20, 42,
           "left: token straggler (% of mean load) and the floor left between nodes; right: "
           "balancing bytes "
           "on the network per micro-batch",
           11, "start", "#555");
  const double name_w = 170, lw = 430, rx = name_w + lw + 80, rw = width - rx - 40;
  double smax = 1, nmax = 1;
  for (const BalanceCell& c : g->cells) {
    if (c.variant) continue;
    smax = std::max(smax, c.summary.token_straggler / g->mean_rows * 100);
    nmax = std::max(nmax, c.summary.network_bytes_per_step / kMiB);
  }
  const auto [s_axis, s_step] = nice_axis(smax);
  const auto [n_axis, n_step] = nice_axis(nmax);
  smax = s_axis;
  nmax = n_axis;
  const double x0 = 20 + name_w;
  svg.text(x0, top - 12, "token straggler, % of mean", 11, "start", "#444", true);
  svg.text(rx, top - 12, "network MiB per step (balancing)", 11, "start", "#444", true);
  double yy = top;
  for (const BalanceCell& c : g->cells) {
    if (c.variant) continue;
    const char* color = policy_color(policy_of_label(c.label));
    const double st = c.summary.token_straggler / g->mean_rows * 100;
    const double floor = c.oracle_straggler / g->mean_rows * 100;
    svg.text(x0 - 8, yy + 14, c.label, 11, "end");
    svg.rect(x0, yy, lw * st / smax, bar_h, color, fmt::format("{}: {:.2f}%", c.label, st));
    svg.text(x0 + lw * st / smax + 5, yy + 14, fmt::format("{:.2f}%", st), 10, "start", "#333");
    svg.line(x0 + lw * floor / smax, yy - 3, x0 + lw * floor / smax, yy + bar_h + 3, colors::kFloor,
             2, "3,2");
    const double net = c.summary.network_bytes_per_step / kMiB;
    svg.rect(rx, yy, rw * net / nmax, bar_h, color, fmt::format("{}: {:.0f} MiB", c.label, net));
    svg.text(rx + rw * net / nmax + 5, yy + 14, fmt::format("{:.0f}", net), 10, "start", "#333");
    yy += bar_h + 8;
  }
  svg.line(x0, top - 4, x0, yy, "#999");
  svg.line(rx, top - 4, rx, yy, "#999");
  for (double v = 0; v <= smax * 1.0001; v += s_step) {
    svg.text(x0 + lw * v / smax, yy + 14, fmt::format("{:g}%", v), 10, "middle", "#555");
  }
  for (double v = 0; v <= nmax * 1.0001; v += n_step) {
    svg.text(rx + rw * v / nmax, yy + 14, fmt::format("{:g}", v), 10, "middle", "#555");
  }
  svg.line(x0, yy + 32, x0 + 20, yy + 32, colors::kFloor, 2, "3,2");
  svg.text(x0 + 26, yy + 36,
           "the floor between nodes: max over nodes of node rows / GPUs - mean (no in-node "
           "balancing goes below it)",
           10, "start", "#444");
  return svg.done();
}

}  // namespace

std::vector<std::string> balance_plot_names() {
  return {"balance-token-straggler.svg", "balance-gemm-straggler.svg", "balance-weight-bytes.svg",
          "balance-pareto.svg", "balance-cross-node.svg"};
}

std::vector<std::pair<std::string, std::string>> balance_plots(const BalanceResult& r) {
  auto straggler = [](const BalanceGroup& g, const BalanceCell& c) {
    return c.summary.token_straggler / g.mean_rows * 100;
  };
  auto gemm = [](const BalanceGroup&, const BalanceCell& c) { return c.summary.gemm_straggler_ms; };
  auto weights = [](const BalanceGroup&, const BalanceCell& c) {
    return c.summary.weight_bytes_per_step / kMiB;
  };
  return {
      {"balance-token-straggler.svg",
       two_panel_plot(r, "Token straggler (max - mean rows per GPU), % of the mean load",
                      "mean over steps; log scale, 0 drawn at '0'; dashed: feplb with homes placed "
                      "from history",
                      LogAxis{0.01, 100, 0, 0}, "%", straggler)},
      {"balance-gemm-straggler.svg",
       two_panel_plot(
           r, "GEMM straggler (slowest - mean modelled expert GEMM time per GPU), ms",
           "roofline cost model, mean over steps; log scale; dashed: feplb with placed homes",
           LogAxis{0.01, 10, 0, 0, 16, false}, " ms", gemm)},
      {"balance-weight-bytes.svg",
       two_panel_plot(r, "Expert weight bytes moved per micro-batch and layer, MiB",
                      "EPLB: replicas installed at replans, averaged over the micro-batches; log "
                      "scale, 0 drawn at '0'",
                      LogAxis{1, 10000, 0, 0}, "", weights)},
      {"balance-pareto.svg", pareto_plot(r)},
      {"balance-cross-node.svg", cross_node_plot(r)},
  };
}

}  // namespace feplb
