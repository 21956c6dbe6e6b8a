#include "feplb/sim/markdown.h"

#include "feplb/core/text.h"

namespace feplb::md {

std::string Table::str() const {
  if (rows_.empty()) return "";
  const auto line = [](const std::vector<std::string>& cells) {
    std::string out = "|";
    for (const std::string& c : cells) {
      std::string cell = printable(c);
      for (size_t at = cell.find('|'); at != std::string::npos; at = cell.find('|', at + 2)) {
        cell.replace(at, 1, "\\|");
      }
      out += " " + cell + " |";
    }
    return out + "\n";
  };
  std::string out = line(header_) + "|";
  for (size_t i = 0; i < header_.size(); ++i) out += "---|";
  out += "\n";
  for (const auto& r : rows_) out += line(r);
  return out + "\n";
}

std::string pct(double v, double mean) {
  return fmt::format("{:.2f}%", mean > 0 ? v / mean * 100 : 0.0);
}

std::string mib(double bytes) { return fmt::format("{:.0f}", bytes / (1024.0 * 1024.0)); }

std::string verdict(bool met) { return met ? "**met**" : "**not met**"; }

}  // namespace feplb::md
