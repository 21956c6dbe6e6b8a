// A small SVG writer shared by the plots (report.cc's simulate picture, balance_plots.cc): every
// text is escaped for XML (and its control characters shown escaped), so a model name or label
// with & < > " or </text><script> yields valid XML with no live element. One colour per policy.
#pragma once

#include <fmt/format.h>

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace feplb {

// `s` as XML character data or attribute value: & < > " ' as entities; control characters and
// bytes that are not UTF-8 (not allowed in XML 1.0) written as visible \xNN text.
std::string xml_escape(std::string_view s);

// The colour of each policy, used for nothing else in any plot (#555555 for an unknown name).
const char* policy_color(std::string_view policy);

// The other colours of the plots, each with one meaning in every plot.
namespace colors {
inline constexpr const char* kOwnRows = "#b8c4d6";    // rows of a GPU's own experts (bars)
inline constexpr const char* kGuestRows = "#f3d36b";  // guest rows a GPU computes for others
inline constexpr const char* kMean = "#555555";       // the mean rows per GPU (dashed)
inline constexpr const char* kFloor = "#d62789";      // the floor between nodes (dashed)
inline constexpr const char* kFront = "#8c564b";      // the Pareto front
}  // namespace colors

// A round axis maximum >= max and its tick step (1, 2 or 5 times a power of ten; 4 to 7 ticks).
std::pair<double, double> nice_axis(double max);

class Svg {
 public:
  Svg(double width, double height);
  void text(double x, double y, std::string_view t, double size = 11, const char* anchor = "start",
            const char* fill = "#222", bool bold = false);
  void line(double x1, double y1, double x2, double y2, const char* stroke, double width = 1,
            const char* dash = "");
  void rect(double x, double y, double w, double h, const char* fill, std::string_view title = "");
  void marker(double x, double y, double r, const char* fill, bool hollow, std::string_view title);
  void polyline(const std::vector<std::pair<double, double>>& pts, const char* stroke, double width,
                const char* dash = "");
  std::string done();

 private:
  std::string s_;
};

}  // namespace feplb
