// Loads: what feplb balances, per GPU, while a plan is made: rows, or (balancing time) modelled
// GEMM time in row equivalents (LoadMeasure, with its GEMM-time table); each GPU's caps and slots.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "feplb/core/cost_model.h"
#include "feplb/core/planners/feplb/bisect.h"
#include "feplb/core/routing.h"
#include "feplb/core/topology.h"

namespace feplb::feplb_detail {

// Balancing time: row counts below this have their GEMM time tabled (8 bytes each); larger ones
// ask the cost model.
inline constexpr int64_t kGemmTableRows = 1 << 18;

// Loads are in units: rows, or (time weight 1) modelled GEMM time in row equivalents, the cost of
// an expert GEMM over `rows` rows divided by the cost of one more row at large row counts: the
// same as rows where the GEMM is linear, more where a fixed cost dominates; in between, that
// blend of the two. No allocation once its table covers the steps' largest expert count.
class LoadMeasure {
 public:
  explicit LoadMeasure(const GemmCostModel* cost)
      : cost_(cost), unit_ms_(cost ? row_unit_ms(*cost) : 0.0) {}
  LoadMeasure(const LoadMeasure&) = delete;  // table_ points into its own tables
  LoadMeasure& operator=(const LoadMeasure&) = delete;

  // This plan's blend of rows and GEMM time in loads (0: rows).
  void set_time_weight(double time_weight) {
    time_weight_ = time_weight;
    by_time_ = time_weight > 0;
    table_ = by_time_ ? &unit_table(time_weight) : nullptr;
    fixed_units_ = by_time_ ? units(8192) - 8192 : 0;
    shed_memo_.fill({});
  }
  bool by_time() const { return by_time_; }
  // Grows the GEMM-time table, and the unit tables of the blends `time_weights` (0: rows, no
  // table), to cover `rows` (at most kGemmTableRows), so that no later plan of experts with at
  // most that many rows grows them. Leaves the measure by rows.
  void warm(int64_t rows, std::span<const double> time_weights);
  // Reads one entry per cache line of every table (the GEMM-time table, each blend's units and
  // most-rows-within), returning a sum of them: brings them into the CPU's caches
  // (Planner::prime). Changes nothing.
  int64_t touch() const {
    int64_t sum = 0;
    for (size_t i = 0; i < gemm_ms_.size(); i += 8) sum += gemm_ms_[i] > 0 ? 1 : 0;
    for (const UnitTable& t : unit_tables_) {
      for (size_t i = 0; i < t.units.size(); i += 8) sum += t.units[i];
      for (size_t i = 0; i < t.within.size(); i += 16) sum += t.within[i];
    }
    return sum;
  }

  // units() of `rows` whose GEMM time gemm_ms(rows) is `ms` (the same number, from the step's
  // table of its counts' times: no lookup by row count).
  int64_t units_at(int64_t rows, double ms) const { return by_time_ ? blend_of(rows, ms) : rows; }
  int64_t units(int64_t rows) const {
    if (!by_time_) return rows;
    // Tabled per blend: the planner's inner loop (bisections over slice sizes) asks it most.
    if (static_cast<uint64_t>(rows) < table_->units.size())
      return table_->units[static_cast<size_t>(rows)];
    return units_beyond(rows);
  }
  // The cost model's time for one expert GEMM over `rows` rows, looked up in a table (the same
  // numbers: units() and the copy rules ask it in the planner's inner loops).
  double gemm_ms(int64_t rows) const {
    if (static_cast<uint64_t>(rows) >= static_cast<uint64_t>(kGemmTableRows))
      return cost_->expert_ms(rows);
    if (rows >= static_cast<int64_t>(gemm_ms_.size())) grow_gemm_table(rows);
    return gemm_ms_[static_cast<size_t>(rows)];
  }
  // The load a donor sheds by giving `rows` more of an expert of which it still holds `held`.
  int64_t give_units(int64_t held, int64_t rows) const {
    return by_time_ ? units(held) - units(held - rows) : rows;
  }
  // The fewest rows of an expert (`held` at the donor) whose giving sheds at least `u` units (all
  // `held` if none do).
  int64_t rows_shedding(int64_t held, int64_t u) const {
    if (!by_time_) return u;
    // Giving s rows leaves units(held - s): the fewest s is held less the most rows within
    // units(held) - u (none within it when that is below 0: all held).
    if (static_cast<uint64_t>(held) < table_->units.size()) {
      const int64_t left = units(held) - u;
      if (left < 0) return held;
      if (const int64_t r = tabled_within(held, left); r >= 0) return held - std::min(held, r);
    }
    // The spill asks the same (held, u) again while nothing moved: the last answers are kept.
    for (const Shed& m : shed_memo_) {
      if (m.held == held && m.u == u) return m.rows;
    }
    // Where the GEMM is linear, giving u rows sheds u units: the search starts there.
    const int64_t at_held = units(held);
    const int64_t rows =
        first_true_near(0, held, u, [&](int64_t s) { return at_held - units(held - s) >= u; });
    shed_memo_[shed_next_] = {held, u, rows};
    shed_next_ = (shed_next_ + 1) % shed_memo_.size();
    return rows;
  }
  // The most rows (at most `limit`) a receiver takes as a new slice within `u` units.
  int64_t rows_within(int64_t u, int64_t limit) const {
    if (!by_time_) return u;
    if (u <= 0 || limit <= 0) return 0;
    if (const int64_t r = tabled_within(limit, u); r >= 0) return std::min(limit, r);
    // Where the GEMM is linear, s rows cost s plus the fixed cost: the search starts there.
    return first_true_near(0, limit + 1, u - fixed_units_,
                           [&](int64_t s) { return s > limit || units(s) > u; }) -
           1;
  }

 private:
  // A blend's units by rows, [0, size()), grown on demand like the GEMM-time table.
  // Also the most rows within each number of units, from the least number at which the rows
  // within it are a prefix of the table (all of them where the units never decrease with rows,
  // as the roofline's; a measured table that dips at a few rows leaves out the numbers below
  // its dip): rows_shedding() and rows_within() look their answer up there instead of searching,
  // the same answer (a search of a predicate that turns once has one).
  struct UnitTable {
    double weight = -1;
    std::vector<int64_t> units;
    std::vector<int32_t> within;  // [largest units + 1] the most rows r with units[r] <= index
    size_t within_of = 0;         // units.size() when `within` was made (0: not yet)
    int64_t within_from = 0;      // `within` holds from this many units
  };
  // The most-rows-within table is made only while the units stay below this many per tabled row
  // (plus kWithinUnitsMin): its size is the largest units' (4 bytes each).
  static constexpr int64_t kWithinUnitsPerRow = 8;
  static constexpr int64_t kWithinUnitsMin = 1 << 16;
  // Blends tabled at once (the time budget's tries use four); another one replaces the oldest.
  static constexpr int kUnitTables = 6;

  // units() of one blend, rounded half up without libm's llround; `ms`: gemm_ms(rows).
  int64_t blend_of(int64_t rows, double ms) const {
    const double time = ms / unit_ms_;
    return static_cast<int64_t>((1.0 - time_weight_) * static_cast<double>(rows) +
                                time_weight_ * time + 0.5);
  }
  int64_t blend_units(int64_t rows) const { return blend_of(rows, gemm_ms(rows)); }
  // The most rows with at most `u` units, looked up where the table covers `rows` and holds it
  // for `u` (made or remade on first use after the units table grew); -1: the caller searches.
  int64_t tabled_within(int64_t rows, int64_t u) const {
    UnitTable& t = *table_;
    if (static_cast<uint64_t>(rows) >= t.units.size()) return -1;
    if (t.within_of != t.units.size()) make_within(t);
    if (u < t.within_from) return -1;
    return t.within[static_cast<size_t>(
        std::min<int64_t>(u, static_cast<int64_t>(t.within.size()) - 1))];
  }
  static void make_within(UnitTable& t);
  // units() beyond the blend's table: extends it to cover `rows` (at most kGemmTableRows), or
  // computes it.
  int64_t units_beyond(int64_t rows) const;
  // The table of `time_weight` (emptied if it was another blend's).
  UnitTable& unit_table(double time_weight);
  // A table's size to cover `rows`: the next multiple of kTableChunkRows. Grown by what the
  // steps ask and no more (not doubled: each entry of the GEMM-time table is a cost-model call,
  // about 1,000 instructions with the roofline, so doubling 16,384 rows to 32,768 made one plan
  // at EP=8 take 4 to 9 ms).
  static constexpr size_t kTableChunkRows = 1024;
  static size_t table_rows_for(int64_t rows) {
    return (static_cast<size_t>(rows) / kTableChunkRows + 1) * kTableChunkRows;
  }
  // Extends gemm_ms_ to cover `rows` (at most kGemmTableRows: it grows only while the steps'
  // largest expert count does).
  void grow_gemm_table(int64_t rows) const;
  static double row_unit_ms(const GemmCostModel& cost);

  const GemmCostModel* cost_;
  const double unit_ms_;     // by time: the GEMM time of one row, at large row counts
  double time_weight_ = 0;   // this plan's blend (units())
  bool by_time_ = false;     // time_weight_ > 0
  int64_t fixed_units_ = 0;  // by time: a GEMM's fixed cost where it is linear (units(s) - s)
  mutable std::vector<double> gemm_ms_;  // GEMM time by rows (ms), grown on demand
  UnitTable* table_ = nullptr;           // by time: this blend's units by rows
  mutable std::array<UnitTable, kUnitTables> unit_tables_;
  int next_table_ = 0;  // the table a new blend takes
  // rows_shedding()'s last answers (this blend's).
  struct Shed {
    int64_t held = -1, u = 0, rows = 0;
  };
  mutable std::array<Shed, 2> shed_memo_;
  mutable size_t shed_next_ = 0;
};

// The GEMM times of a LoadMeasure's table as a cost model (the same numbers as its cost model's:
// the table holds them): the schedule writer of feplb's plans reads them there, so that a plan
// looks each expert's count up in one table by row count, not two (its cost model keeps one too).
class TabledGemmCost final : public GemmCostModel {
 public:
  explicit TabledGemmCost(const LoadMeasure& measure) : measure_(&measure) {}
  double expert_ms(int64_t rows) const override { return measure_->gemm_ms(rows); }

 private:
  const LoadMeasure* measure_;
};

// The loads of one plan being made, and the caps of the domain being balanced.
struct Loads {
  explicit Loads(const GemmCostModel* cost) : measure(cost) {}

  // Every expert at home, measured with `time_weight`; `row_budget` >= 0: a GPU may end at most
  // that many rows above its domain's mean (-1: no row cap).
  void start(const Topology& topo, const RoutingStep& routing, double time_weight,
             int64_t row_budget);
  // The plans from begin_step() to end_step() are all of one step (BalancedPlan::begin_step):
  // its counts' GEMM times are looked up once (expert_ms()).
  void begin_step() {
    in_step_ = true;
    step_ms_ = false;
  }
  void end_step() {
    in_step_ = false;
    step_ms_ = false;
  }
  // [num_experts] each expert's GEMM time at its count in `routing` (measure.gemm_ms), looked up
  // once per step: the plans of a step read this array, not each its own lines of the tables by
  // row count. No allocation once warm.
  const std::vector<double>& expert_ms(const RoutingStep& routing);
  // The domain's caps: a GPU above `domain_cap` units, or above the row cap, must give.
  void set_domain(const Topology& topo, int domain, int64_t domain_cap);

  int64_t remaining(int e) const { return (*counts)[e] - moved[e]; }
  // Whether d must give more away: above the cap, or above the row cap.
  bool over(int d) const { return load[d] > cap || rows_at[d] > row_cap; }
  // Whether g has room: below the cap (under a row cap, time room is not required: a donor above
  // the row cap may have to give beyond it) and below the row cap.
  bool has_room(int g) const { return (load[g] < cap || row_budget >= 0) && rows_at[g] < row_cap; }
  // The rows of e that bring d down to `level` units and below the row cap.
  int64_t shed_rows(int e, int d, int64_t level) const {
    return std::max(measure.rows_shedding(remaining(e), load[d] - level), rows_at[d] - row_cap);
  }
  // The load d sheds by giving `rows` more of e away.
  int64_t give_units(int e, int64_t rows) const { return measure.give_units(remaining(e), rows); }
  // `rows` of e move from d to h (a guest slot taken unless its weights were prefetched there).
  void move(int e, int d, int h, int64_t rows, bool weights_there) {
    load[d] -= give_units(e, rows);
    load[h] += measure.units(rows);
    rows_at[d] -= rows;
    rows_at[h] += rows;
    moved[e] += rows;
    if (!weights_there) ++guests[h];
  }

  // The token straggler of rows_at within the NVLink domains (what balancing can remove): the
  // largest of a GPU's rows above its domain's mean.
  double row_straggler(const Topology& topo) const;

  LoadMeasure measure;
  const std::vector<int64_t>* counts = nullptr;  // this step's expert_counts
  std::vector<int64_t> load;                     // [num_ranks] units each GPU computes, as planned
  std::vector<int64_t> rows_at;                  // [num_ranks] rows each GPU computes, as planned
  std::vector<int64_t> moved;                    // [num_experts] rows of each expert given away
  std::vector<int64_t> guests;                   // [num_ranks] guest weight slots taken
  int64_t row_budget = -1;  // >= 0: a GPU may end at most this many rows above the mean
  int64_t cap = 0;          // the domain's target + tolerance
  int64_t row_cap = std::numeric_limits<int64_t>::max();  // the domain's row cap

 private:
  std::vector<double> expert_ms_;  // expert_ms()
  bool in_step_ = false;           // between begin_step() and end_step()
  bool step_ms_ = false;           // expert_ms_ holds this step's
};

}  // namespace feplb::feplb_detail
