// PlannerClock: what a layer's recent plans took on this host, for its next plans
// (Planner::set_recent_plan_us). The GPU layer sends it with every forward's counts and every
// rank takes the largest; the simulator feeds its planners the same. On a host slower than the
// knobs' reserve assumes, feplb then compares its modes as they run there.
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace feplb {

class PlannerClock {
 public:
  static constexpr int kPlans = 64;    // the plans it remembers
  static constexpr int kOutliers = 2;  // the longest ones it passes over

  // After a plan in `mode` that took `us`, chosen from `candidates` modes (Plan::candidates: more
  // than one, its time is several plans', not one of its mode's, and is passed over). Returns
  // recent_us().
  int32_t add(const std::string& mode, double us, int32_t candidates);
  // The third longest of the last kPlans plans in the mode of the last one (about their p97; the
  // longest while there are fewer than three), whole us; 0 before any plan. A change of mode
  // starts again (modes take different times); a spike of milliseconds (the host's, or a table
  // grown) does not hold for kPlans plans.
  int32_t recent_us() const { return recent_us_; }

 private:
  std::string mode_;
  std::array<double, kPlans> us_{};
  int count_ = 0, next_ = 0;
  int32_t recent_us_ = 0;
};

}  // namespace feplb
