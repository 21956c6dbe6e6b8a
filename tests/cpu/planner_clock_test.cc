// PlannerClock: the third longest of a layer's last 64 plans in its mode, whole us.
#include "feplb/core/planners/planner_clock.h"

#include <gtest/gtest.h>

#include <string>

namespace feplb {
namespace {

TEST(PlannerClock, TheThirdLongestOfTheLast64PlansInTheMode) {
  PlannerClock c;
  EXPECT_EQ(c.recent_us(), 0);  // no plan yet
  // Fewer than three plans: the longest, rounded up.
  EXPECT_EQ(c.add("rows", 10.2, 1), 11);
  EXPECT_EQ(c.add("rows", 30.0, 1), 30);
  // From the third: the third longest (two spikes pass).
  EXPECT_EQ(c.add("rows", 5.0, 1), 5);
  EXPECT_EQ(c.add("rows", 3000.0, 1), 11);
  EXPECT_EQ(c.add("rows", 2000.0, 1), 30);
  EXPECT_EQ(c.recent_us(), 30);
  // The window holds 64 plans: with 59 more of 7 us all are in it, the third longest still 30;
  // three more push out 10.2, 30 and 5, leaving the two spikes and 7s.
  for (int i = 0; i < PlannerClock::kPlans - 5; ++i) c.add("rows", 7.0, 1);
  EXPECT_EQ(c.recent_us(), 30);
  for (int i = 0; i < 3; ++i) c.add("rows", 7.0, 1);
  EXPECT_EQ(c.recent_us(), 7);
  // A change of mode starts again: its first plan alone.
  EXPECT_EQ(c.add("time", 42.5, 1), 43);
  EXPECT_EQ(c.add("time", 1.0, 1), 43);
  EXPECT_EQ(c.add("time", 1.0, 1), 1);
  // A plan chosen from several candidates (their time, not one plan's) is passed over, whatever
  // its mode: the time mode's plans go on (42.5, 1, 1, 2: the third longest, 1).
  EXPECT_EQ(c.add("rows", 500.0, 4), 1);
  EXPECT_EQ(c.add("time", 2.0, 1), 1);
}

}  // namespace
}  // namespace feplb
