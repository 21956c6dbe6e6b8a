// Hand-written SVG for the reports' plots: a small writer, log axes, and a line panel (one line
// per series over categorical x). Shared by the balance plots (balance_plots.cc) and the rack
// plots (rack.cc).
#pragma once

#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace feplb::svg {

inline constexpr double kNan = std::numeric_limits<double>::quiet_NaN();

// The colour every plot gives a policy (grey for an unknown name).
const char* color_of(const std::string& policy);

class Svg {
 public:
  Svg(double width, double height);
  void text(double x, double y, const std::string& t, double size = 11,
            const char* anchor = "start", const char* fill = "#222", bool bold = false);
  void line(double x1, double y1, double x2, double y2, const char* stroke, double width = 1,
            const char* dash = "");
  void rect(double x, double y, double w, double h, const char* fill,
            const std::string& title = "");
  void marker(double x, double y, double r, const char* fill, bool hollow,
              const std::string& title);
  void polyline(const std::vector<std::pair<double, double>>& pts, const char* stroke, double width,
                const char* dash = "");
  std::string done() { return s_ + "</svg>\n"; }

 private:
  std::string s_;
};

// A log axis over [lo, hi] mapped to pixels [p_lo, p_hi], with a separate position for 0 (values
// <= 0 or below lo) one step beyond p_lo.
struct LogAxis {
  double lo, hi, p_lo, p_hi, zero_gap = 16;
  bool zero_row = true;  // draw a '0' row for values <= 0
  double zero() const { return p_lo + (p_hi > p_lo ? -zero_gap : zero_gap); }
  double map(double v) const;
};

std::string tick_label(double v, const std::string& unit);

// Draws y ticks (decades) and grid for a vertical log axis on [x0, x1].
void y_log_ticks(Svg& svg, const LogAxis& y, double x0, double x1, const std::string& unit);

// A round axis maximum and its tick step (1, 2 or 5 times a power of ten; 4 to 7 ticks).
std::pair<double, double> nice_axis(double max);

struct Series {
  std::string label;
  const char* color;
  const char* dash;
  std::vector<double> values;  // NaN: missing
};

// One panel: categorical x (labels), log y, one line + markers per series.
void line_panel(Svg& svg, double x0, double y0, double w, double h, const std::string& title,
                const std::string& xtitle, const std::vector<std::string>& xlabels,
                const std::vector<Series>& series, const LogAxis& yspec, const std::string& unit);

void legend(Svg& svg, double x, double y, const std::vector<Series>& series);

}  // namespace feplb::svg
