#include "feplb/core/planners/feplb/loads.h"

#include <algorithm>
#include <numeric>

#include "feplb/core/planners/planner.h"

namespace feplb::feplb_detail {

void LoadMeasure::grow_gemm_table(int64_t rows) const {
  const size_t old = gemm_ms_.size();
  gemm_ms_.resize(std::min<size_t>(table_rows_for(rows), kGemmTableRows));
  for (size_t r = old; r < gemm_ms_.size(); ++r) {
    gemm_ms_[r] = r == 0 ? 0.0 : cost_->expert_ms(static_cast<int64_t>(r));
  }
}

int64_t LoadMeasure::units_beyond(int64_t rows) const {
  std::vector<int64_t>& table = table_->units;
  if (rows < 0 || rows >= kGemmTableRows) return blend_units(rows);
  const size_t old = table.size();
  table.resize(std::min<size_t>(table_rows_for(rows), kGemmTableRows));
  for (size_t r = old; r < table.size(); ++r) table[r] = blend_units(static_cast<int64_t>(r));
  return table[static_cast<size_t>(rows)];
}

void LoadMeasure::warm(int64_t rows, std::span<const double> time_weights) {
  rows = std::min<int64_t>(rows, kGemmTableRows - 1);
  if (rows <= 0) return;
  if (rows >= static_cast<int64_t>(gemm_ms_.size())) grow_gemm_table(rows);
  for (const double w : time_weights) {
    if (w <= 0) continue;
    set_time_weight(w);
    tabled_within(rows, units(rows));  // grows the blend's units, then makes its within table
  }
  set_time_weight(0);
}

LoadMeasure::UnitTable& LoadMeasure::unit_table(double time_weight) {
  for (UnitTable& t : unit_tables_) {
    if (t.weight == time_weight) return t;
  }
  UnitTable& t = unit_tables_[static_cast<size_t>(next_table_)];
  next_table_ = (next_table_ + 1) % kUnitTables;
  t.weight = time_weight;
  t.units.clear();
  t.within_of = 0;
  return t;
}

void LoadMeasure::make_within(UnitTable& t) {
  const std::vector<int64_t>& u = t.units;
  const size_t n = u.size();
  t.within_of = n;
  // The units never decrease from row `dip` (the last row with fewer than the row before);
  // from the largest units before it, the rows within any number are a prefix of the table.
  size_t dip = 0;
  for (size_t r = 1; r < n; ++r) {
    if (u[r] < u[r - 1]) dip = r;
  }
  t.within_from = *std::max_element(
      u.begin(), u.begin() + static_cast<std::ptrdiff_t>(std::max<size_t>(dip, 1)));
  const int64_t most = *std::max_element(u.begin(), u.end());
  if (most > kWithinUnitsPerRow * static_cast<int64_t>(n) + kWithinUnitsMin) {
    // Units far above rows (a cost model whose GEMM time barely grows at large row counts, so
    // one row is a tiny unit): no table; the searches answer.
    t.within.clear();
    t.within_from = std::numeric_limits<int64_t>::max();
    return;
  }
  t.within.resize(static_cast<size_t>(most) + 1);
  // Below within_from the entries are never read.
  size_t r = dip > 0 ? dip - 1 : 0;
  for (size_t v = 0; v < t.within.size(); ++v) {
    while (r + 1 < n && u[r + 1] <= static_cast<int64_t>(v)) ++r;
    t.within[v] = static_cast<int32_t>(r);
  }
}

double LoadMeasure::row_unit_ms(const GemmCostModel& cost) {
  const double slope = (cost.expert_ms(16384) - cost.expert_ms(8192)) / 8192.0;
  return slope > 0 ? slope : cost.expert_ms(8192) / 8192.0;
}

void Loads::start(const Topology& topo, const RoutingStep& routing, double time_weight,
                  int64_t budget_rows) {
  const int E = topo.num_experts(), R = topo.num_ranks();
  measure.set_time_weight(time_weight);
  row_budget = budget_rows;
  counts = &routing.expert_counts;
  home_loads(topo, routing, rows_at);
  if (measure.by_time()) {
    load.assign(static_cast<size_t>(R), 0);
    const std::vector<double>& ms = expert_ms(routing);
    for (int e = 0; e < E; ++e) load[topo.home(e)] += measure.units_at((*counts)[e], ms[e]);
  } else {
    load.assign(rows_at.begin(), rows_at.end());
  }
  moved.assign(static_cast<size_t>(E), 0);
  guests.assign(static_cast<size_t>(R), 0);
}

const std::vector<double>& Loads::expert_ms(const RoutingStep& routing) {
  if (!step_ms_) {
    const std::vector<int64_t>& c = routing.expert_counts;
    expert_ms_.resize(c.size());
    for (size_t e = 0; e < c.size(); ++e) expert_ms_[e] = measure.gemm_ms(c[e]);
    step_ms_ = in_step_;
  }
  return expert_ms_;
}

void Loads::set_domain(const Topology& topo, int domain, int64_t domain_cap) {
  cap = domain_cap;
  row_cap = std::numeric_limits<int64_t>::max();
  if (row_budget >= 0) {
    const int first = topo.first_gpu_of_domain(domain), n = topo.domain_size();
    int64_t dom_rows = 0;
    for (int g = first; g < first + n; ++g) dom_rows += rows_at[g];
    row_cap = dom_rows / n + row_budget;
  }
}

double Loads::row_straggler(const Topology& topo) const {
  const int n = topo.domain_size();
  double worst = 0;
  for (int dom = 0; dom < topo.num_domains(); ++dom) {
    const auto first = rows_at.begin() + topo.first_gpu_of_domain(dom);
    const int64_t total = std::accumulate(first, first + n, int64_t{0});
    const int64_t most = *std::max_element(first, first + n);
    worst = std::max(worst, static_cast<double>(most) - static_cast<double>(total) / n);
  }
  return worst;
}

}  // namespace feplb::feplb_detail
