#include "feplb/sim/svg_plot.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace feplb::svg {
namespace {

constexpr const char* kFont = "Helvetica,Arial,sans-serif";

std::string escape(const std::string& s) {
  std::string out;
  for (char ch : s) {
    switch (ch) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      default:
        out += ch;
    }
  }
  return out;
}

}  // namespace

const char* color_of(const std::string& policy) {
  static const std::pair<const char*, const char*> kColors[] = {
      {"static", "#888888"},    {"feplb-paper", "#9b59b6"}, {"feplb", "#1f5fbf"},
      {"fastermoe", "#e8923a"}, {"oracle", "#000000"},      {"eplb", "#2a9d3a"},
      {"llep", "#c0392b"},      {"moonep", "#16a0a0"},
  };
  for (const auto& [name, color] : kColors) {
    if (policy == name) return color;
  }
  return "#555555";
}

Svg::Svg(double width, double height) {
  s_ = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0:.0f}\" height=\"{1:.0f}\" "
      "viewBox=\"0 0 {0:.0f} "
      "{1:.0f}\" font-family=\"{2}\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      width, height, kFont);
}

void Svg::text(double x, double y, const std::string& t, double size, const char* anchor,
               const char* fill, bool bold) {
  s_ += fmt::format(
      "<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"{}\" text-anchor=\"{}\" "
      "fill=\"{}\"{}>{}</text>\n",
      x, y, size, anchor, fill, bold ? " font-weight=\"bold\"" : "", escape(t));
}
void Svg::line(double x1, double y1, double x2, double y2, const char* stroke, double width,
               const char* dash) {
  s_ += fmt::format(
      "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"{}\" "
      "stroke-width=\"{}\"{}/>\n",
      x1, y1, x2, y2, stroke, width, *dash ? fmt::format(" stroke-dasharray=\"{}\"", dash) : "");
}
void Svg::rect(double x, double y, double w, double h, const char* fill, const std::string& title) {
  s_ += fmt::format(
      "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" "
      "fill=\"{}\">{}</rect>\n",
      x, y, w, h, fill, title.empty() ? "" : "<title>" + escape(title) + "</title>");
}
void Svg::marker(double x, double y, double r, const char* fill, bool hollow,
                 const std::string& title) {
  s_ += fmt::format(
      "<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"{}\" fill=\"{}\" stroke=\"{}\" "
      "stroke-width=\"1.5\">"
      "<title>{}</title></circle>\n",
      x, y, r, hollow ? "white" : fill, fill, escape(title));
}
void Svg::polyline(const std::vector<std::pair<double, double>>& pts, const char* stroke,
                   double width, const char* dash) {
  if (pts.size() < 2) return;
  std::string p;
  for (const auto& [x, y] : pts) p += fmt::format("{:.1f},{:.1f} ", x, y);
  s_ += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"{}\"{}/>\n",
                    p, stroke, width, *dash ? fmt::format(" stroke-dasharray=\"{}\"", dash) : "");
}
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

std::pair<double, double> nice_axis(double max) {
  const double mag = std::pow(10.0, std::floor(std::log10(std::max(max, 1e-9))));
  for (double step : {0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0}) {
    const double s = step * mag;
    if (max / s <= 7) return {std::ceil(max / s) * s, s};
  }
  return {max, max / 4};
}

void line_panel(Svg& svg, double x0, double y0, double w, double h, const std::string& title,
                const std::string& xtitle, const std::vector<std::string>& xlabels,
                const std::vector<Series>& series, const LogAxis& yspec, const std::string& unit) {
  const double left = x0 + 48, right = x0 + w - 10, top = y0 + 30, bottom = y0 + h - 52;
  LogAxis y = yspec;
  y.p_lo = bottom - 18;
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
