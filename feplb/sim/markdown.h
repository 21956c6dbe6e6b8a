// Markdown for the reports: tables built from data (one call per row), so that a report is its
// tables and a few sentences of template, not a string builder.
#pragma once

#include <fmt/format.h>

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace feplb::md {

class Table {
 public:
  explicit Table(std::vector<std::string> header) : header_(std::move(header)) {}
  // One row; cells are formatted with fmt's "{}".
  template <typename... Cells>
  Table& row(const Cells&... cells) {
    rows_.push_back({fmt::format("{}", cells)...});
    return *this;
  }
  Table& add(std::vector<std::string> cells) {
    rows_.push_back(std::move(cells));
    return *this;
  }
  bool empty() const { return rows_.empty(); }
  // The table, ending with a blank line ("" when it has no row).
  std::string str() const;

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

// "1.23%" of `v` relative to `mean` (0 when the mean is 0).
std::string pct(double v, double mean);
// Bytes as whole MiB.
std::string mib(double bytes);
// "**met**" / "**not met**".
std::string verdict(bool met);

}  // namespace feplb::md
