#include "feplb/core/planners/planner_clock.h"

#include <algorithm>
#include <cmath>
#include <functional>

namespace feplb {

int32_t PlannerClock::add(const std::string& mode, double us, int32_t candidates) {
  if (candidates > 1) return recent_us_;
  if (mode != mode_) {
    mode_ = mode;
    count_ = next_ = 0;
  }
  us_[static_cast<size_t>(next_)] = us;
  next_ = (next_ + 1) % kPlans;
  count_ = std::min(count_ + 1, kPlans);
  std::array<double, kPlans> sorted;
  std::copy(us_.begin(), us_.begin() + count_, sorted.begin());
  const int k = count_ > kOutliers ? kOutliers : 0;
  std::nth_element(sorted.begin(), sorted.begin() + k, sorted.begin() + count_, std::greater<>());
  return recent_us_ = static_cast<int32_t>(std::ceil(sorted[static_cast<size_t>(k)]));
}

}  // namespace feplb
