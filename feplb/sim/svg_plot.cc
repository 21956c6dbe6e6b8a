#include "feplb/sim/svg_plot.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace feplb::svg {
double LogAxis::map(double v) const {
  if (!(v > 0)) return zero();
  const double t =
      (std::log10(std::clamp(v, lo, hi)) - std::log10(lo)) / (std::log10(hi) - std::log10(lo));
  return p_lo + t * (p_hi - p_lo);
}

std::string tick_label(double v, const std::string& unit) {
  if (v >= 1) return fmt::format("{:.0f}{}", v, unit);
  return fmt::format("{}{}", v, unit);
}

void y_log_ticks(Svg& svg, const LogAxis& y, double x0, double x1, const std::string& unit) {
  for (double v = y.lo; v <= y.hi * 1.0001; v *= 10) {
    const double py = y.map(v);
    svg.line(x0, py, x1, py, "#e6e6e6");
    svg.text(x0 - 5, py + 3.5, tick_label(v, unit), 10, "end", "#555");
  }
  if (!y.zero_row) return;
  svg.text(x0 - 5, y.zero() + 3.5, "0", 10, "end", "#555");
  svg.line(x0, y.zero(), x1, y.zero(), "#f0f0f0", 1, "2,3");
}

void line_panel(Svg& svg, double x0, double y0, double w, double h, const std::string& title,
                const std::string& xtitle, const std::vector<std::string>& xlabels,
                const std::vector<Series>& series, const LogAxis& yspec, const std::string& unit) {
  const double left = x0 + 48, right = x0 + w - 10, top = y0 + 30, bottom = y0 + h - 52;
  LogAxis y = yspec;
  y.p_lo = bottom - 24;  // the '0' row 8 px above the axis
  y.p_hi = top;
  svg.text(x0, y0 + 14, title, 13, "start", "#222", true);
  y_log_ticks(svg, y, left, right, unit);
  svg.line(left, top, left, bottom, "#999");
  svg.line(left, bottom, right, bottom, "#999");
  const size_t n = xlabels.size();
  auto xpos = [&](size_t i) {
    return left + (right - left) * (static_cast<double>(i) + 0.5) / static_cast<double>(n);
  };
  for (size_t i = 0; i < n; ++i) svg.text(xpos(i), bottom + 14, xlabels[i], 10, "middle", "#444");
  svg.text((left + right) / 2, bottom + 30, xtitle, 10, "middle", "#666");
  for (const Series& s : series) {
    // Segments between two values; one that reaches the '0' row (off the log scale) is dotted.
    for (size_t i = 0; i + 1 < n && i + 1 < s.values.size(); ++i) {
      const double a = s.values[i], b = s.values[i + 1];
      if (std::isnan(a) || std::isnan(b)) continue;
      svg.polyline({{xpos(i), y.map(a)}, {xpos(i + 1), y.map(b)}}, s.color, 1.8,
                   a > 0 && b > 0 ? s.dash : "1,3");
    }
    for (size_t i = 0; i < n && i < s.values.size(); ++i) {
      if (std::isnan(s.values[i])) continue;
      svg.marker(xpos(i), y.map(s.values[i]), 3, s.color, *s.dash != 0,
                 fmt::format("{}, {}: {:.3g}{}", s.label, xlabels[i], s.values[i], unit));
    }
  }
}

void legend(Svg& svg, double x, double y, const std::vector<Series>& series) {
  for (size_t i = 0; i < series.size(); ++i) {
    const double ly = y + static_cast<double>(i) * 17;
    svg.line(x, ly, x + 22, ly, series[i].color, 2, series[i].dash);
    svg.marker(x + 11, ly, 3, series[i].color, *series[i].dash != 0, series[i].label);
    svg.text(x + 28, ly + 4, series[i].label, 11);
  }
}

}  // namespace feplb::svg
