#include "feplb/sim/svg.h"

#include <algorithm>
#include <cmath>

#include "feplb/core/text.h"

namespace feplb {
namespace {

constexpr const char* kFont = "Helvetica,Arial,sans-serif";

}  // namespace

std::string xml_escape(std::string_view raw) {
  const std::string s = printable(raw);  // no control characters or stray bytes left
  std::string out;
  out.reserve(s.size());
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
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out += ch;
    }
  }
  return out;
}

const char* policy_color(std::string_view policy) {
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

std::pair<double, double> nice_axis(double max) {
  const double mag = std::pow(10.0, std::floor(std::log10(std::max(max, 1e-9))));
  for (double step : {0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0}) {
    const double s = step * mag;
    if (max / s <= 7) return {std::max(s, std::ceil(max / s) * s), s};
  }
  return {max, max / 4};
}

Svg::Svg(double width, double height) {
  s_ = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0:.0f}\" height=\"{1:.0f}\" "
      "viewBox=\"0 0 {0:.0f} {1:.0f}\" font-family=\"{2}\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      width, height, kFont);
}

void Svg::text(double x, double y, std::string_view t, double size, const char* anchor,
               const char* fill, bool bold) {
  s_ += fmt::format(
      "<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"{}\" text-anchor=\"{}\" "
      "fill=\"{}\"{}>{}</text>\n",
      x, y, size, anchor, fill, bold ? " font-weight=\"bold\"" : "", xml_escape(t));
}

void Svg::line(double x1, double y1, double x2, double y2, const char* stroke, double width,
               const char* dash) {
  s_ += fmt::format(
      "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"{}\" "
      "stroke-width=\"{}\"{}/>\n",
      x1, y1, x2, y2, stroke, width, *dash ? fmt::format(" stroke-dasharray=\"{}\"", dash) : "");
}

void Svg::rect(double x, double y, double w, double h, const char* fill, std::string_view title) {
  s_ += fmt::format(
      "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"{}\">{}</rect>\n",
      x, y, w, h, fill, title.empty() ? "" : "<title>" + xml_escape(title) + "</title>");
}

void Svg::marker(double x, double y, double r, const char* fill, bool hollow,
                 std::string_view title) {
  s_ += fmt::format(
      "<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"{}\" fill=\"{}\" stroke=\"{}\" "
      "stroke-width=\"1.5\"><title>{}</title></circle>\n",
      x, y, r, hollow ? "white" : fill, fill, xml_escape(title));
}

void Svg::polyline(const std::vector<std::pair<double, double>>& pts, const char* stroke,
                   double width, const char* dash) {
  if (pts.size() < 2) return;
  std::string p;
  for (const auto& [x, y] : pts) p += fmt::format("{:.1f},{:.1f} ", x, y);
  s_ += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"{}\"{}/>\n",
                    p, stroke, width, *dash ? fmt::format(" stroke-dasharray=\"{}\"", dash) : "");
}

std::string Svg::done() { return s_ + "</svg>\n"; }

}  // namespace feplb
