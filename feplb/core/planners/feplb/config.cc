#include "feplb/core/planners/feplb/config.h"

#include <fmt/format.h>

#include <string_view>
#include <variant>
#include <vector>

#include "feplb/core/error.h"

namespace feplb {
namespace {

// Checks `value` against knobs.def's range for knob `name`, with validate_knobs()'s message.
void check_range(std::string_view name, double value) {
  Knobs table;
  for (const KnobInfo& k : list_knobs(table)) {
    if (k.name != name) continue;
    FEPLB_REQUIRE_INPUT(value >= k.minimum && value <= k.maximum, "{}: {} is outside [{}, {}] {}",
                        k.flag, value, k.minimum, k.maximum, k.unit);
    return;
  }
  FEPLB_CHECK(false, "feplb: no knob '{}'", name);
}

std::string_view path_words(FeplbPath path) {
  return path == FeplbPath::kOneHop ? "one-hop" : "two-phase";
}

std::string_view copy_rule_words(FeplbCopyRule rule) {
  switch (rule) {
    case FeplbCopyRule::kIgnore:
      return "copy time ignored";
    case FeplbCopyRule::kHidden:
      return "hidden copies";
    case FeplbCopyRule::kExposedBeforeDonor:
      return "exposed copies before the donor";
    case FeplbCopyRule::kLateByBusiest:
      return "late copies by the busiest";
  }
  return "?";
}

std::string balance_words(const FeplbConfig& c) {
  switch (c.balance) {
    case FeplbBalance::kRows:
      return "rows";
    case FeplbBalance::kTimeBlend:
      return c.time_weight == 1.0 ? "time" : fmt::format("time blend {:g}", c.time_weight);
    case FeplbBalance::kTimeBudget:
      switch (c.budget_tries) {
        case FeplbBudgetTries::kBoth:
          break;
        case FeplbBudgetTries::kBlends:
          return fmt::format("time budget {:g} (blends)", c.time_budget);
        case FeplbBudgetTries::kCapped:
          return fmt::format("time budget {:g} (capped)", c.time_budget);
        case FeplbBudgetTries::kAll:
          return fmt::format("time budget {:g} (or rows)", c.time_budget);
      }
      return fmt::format("time budget {:g}", c.time_budget);
  }
  return "?";
}

}  // namespace

FeplbConfig FeplbConfig::from_knobs(const Knobs& k, bool has_cost_model) {
  FEPLB_CHECK(k.one_hop >= 0 && k.prefetch >= 0 && k.copy_timing >= 0 && k.time_balance_budget >= 0,
              "feplb: a switch left to the chooser (-1) reached a one-mode planner");
  check_range("one_hop", static_cast<double>(k.one_hop));
  check_range("prefetch", static_cast<double>(k.prefetch));
  check_range("copy_timing", static_cast<double>(k.copy_timing));
  check_range("feplb_dyn_set", static_cast<double>(k.feplb_dyn_set));
  check_range("balance_time_weight", k.balance_time_weight);
  check_range("time_balance_budget", k.time_balance_budget);
  FEPLB_REQUIRE_INPUT(
      k.balance_time_weight == 0 || k.time_balance_budget == 0,
      "--balance-time-weight: {} has no effect with --time-balance-budget {} (the budget tries "
      "its own blends and time under a row cap); set one of them",
      k.balance_time_weight, k.time_balance_budget);
  FeplbConfig c;
  c.path = k.one_hop ? FeplbPath::kOneHop : FeplbPath::kTwoPhase;
  c.prefetch = k.prefetch ? FeplbPrefetch::kOn : FeplbPrefetch::kOff;
  if (k.time_balance_budget > 0) {
    c.balance = FeplbBalance::kTimeBudget;
    c.time_budget = k.time_balance_budget;
  } else if (k.balance_time_weight > 0) {
    c.balance = FeplbBalance::kTimeBlend;
    c.time_weight = k.balance_time_weight;
  }
  c.copy_rule = static_cast<FeplbCopyRule>(k.copy_timing);
  c.candidates = k.feplb_dyn_set ? FeplbCandidates::kPlacementSets : FeplbCandidates::kBusiest;
  c.dyn = k.dyn;
  c.dyn_cover = k.dyn_cover;
  c.balance_tolerance = k.balance_tolerance;
  c.min_slice_rows = k.min_slice_rows;
  c.slice_align_rows = k.slice_align_rows;
  c.max_helpers_per_expert = k.max_helpers_per_expert;
  c.max_num_dyn = k.max_num_dyn;
  c.validate(has_cost_model);
  return c;
}

void FeplbConfig::validate(bool has_cost_model) const {
  check_range("dyn", static_cast<double>(dyn));
  check_range("dyn_cover", dyn_cover);
  check_range("balance_tolerance", balance_tolerance);
  check_range("min_slice_rows", static_cast<double>(min_slice_rows));
  check_range("slice_align_rows", static_cast<double>(slice_align_rows));
  check_range("max_helpers_per_expert", static_cast<double>(max_helpers_per_expert));
  check_range("max_num_dyn", static_cast<double>(max_num_dyn));
  FEPLB_REQUIRE_INPUT(balance != FeplbBalance::kTimeBlend || (time_weight > 0 && time_weight <= 1),
                      "--balance-time-weight: a time blend needs a weight in (0, 1], not {}",
                      time_weight);
  FEPLB_REQUIRE_INPUT(balance != FeplbBalance::kTimeBudget || (time_budget > 0 && time_budget <= 1),
                      "--time-balance-budget: a time budget needs a fraction in (0, 1], not {}",
                      time_budget);
  FEPLB_REQUIRE_INPUT(
      path == FeplbPath::kOneHop || candidates != FeplbCandidates::kEveryLocal,
      "--feplb-dyn-set: two-phase plans start their static experts before the plan exists, so "
      "every local expert as a candidate is one-hop's rule (--one-hop 1)");
  FEPLB_REQUIRE_INPUT(has_cost_model || copy_rule == FeplbCopyRule::kIgnore,
                      "--copy-timing {}: timing copies needs a GEMM cost model (0 ignores copy "
                      "time)",
                      static_cast<int>(copy_rule));
  FEPLB_REQUIRE_INPUT(has_cost_model || balance == FeplbBalance::kRows,
                      "--balance-time-weight / --time-balance-budget: balancing time needs a GEMM "
                      "cost model");
}

std::string FeplbConfig::label() const {
  std::string out(path_words(path));
  if (path == FeplbPath::kTwoPhase && candidates == FeplbCandidates::kPlacementSets)
    out += ", placement's sets";
  if (prefetch == FeplbPrefetch::kOn) out += ", prefetch";
  out += ", " + balance_words(*this);
  out += ", ";
  out += copy_rule_words(copy_rule);
  return out;
}

std::string FeplbConfig::describe() const {
  std::string candidate_words;
  switch (candidate_set()) {
    case FeplbCandidates::kBusiest:
      candidate_words = fmt::format("each GPU's {} busiest of the micro-batch", dyn);
      break;
    case FeplbCandidates::kPlacementSets:
      candidate_words = "the placement's dynamic sets, busiest first";
      break;
    case FeplbCandidates::kEveryLocal:
      candidate_words =
          "every local expert (one-hop plans before the dispatch, so nothing starts before the "
          "plan: --feplb-dyn-set and --dyn-cover apply to two-phase plans only)";
      break;
  }
  if (candidate_cover() > 0) {
    candidate_words += fmt::format(
        ", more while they hold less than {:g}x the GPU's rows above its domain's mean", dyn_cover);
  }
  return fmt::format(
      "path {}; prefetch {}; balance {}; copies: {}; candidates: {}; tolerance {:g} x mean load; "
      "slices of at least {} rows, split at multiples of {}; at most {} helpers per expert and {} "
      "guests per GPU",
      path_words(path), prefetch == FeplbPrefetch::kOn ? "on" : "off", balance_words(*this),
      copy_rule_words(copy_rule), candidate_words, balance_tolerance, min_slice_rows,
      slice_align_rows, max_helpers_per_expert, max_num_dyn);
}

}  // namespace feplb
