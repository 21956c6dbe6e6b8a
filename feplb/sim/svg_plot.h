// The reports' line plots on svg.h's writer: log axes, and a line panel (one line
// per series over categorical x). Shared by the balance plots (balance_plots.cc) and the rack
// plots (rack.cc).
#pragma once

#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "feplb/sim/svg.h"

namespace feplb::svg {

inline constexpr double kNan = std::numeric_limits<double>::quiet_NaN();

using ::feplb::nice_axis;
using ::feplb::Svg;
// The colour every plot gives a policy (svg.h's policy_color).
inline const char* color_of(const std::string& policy) { return policy_color(policy); }

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
