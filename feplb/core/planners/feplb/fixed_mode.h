// The knobs of feplb's one fixed mode from before it chose its own: two-phase, no prefetch,
// hidden copies, rows, 20 us reserved for the planner. Tests of one mode's behaviour and the plan
// fingerprints (bench/cpu/plan_dump.cc) start from it; Knobs{} leaves the mode to the chooser.
#pragma once

#include "feplb/core/knobs.h"

namespace feplb {

inline Knobs fixed_mode_knobs() {
  Knobs k;
  k.one_hop = 0;
  k.prefetch = 0;
  k.copy_timing = 1;
  k.time_balance_budget = 0;
  k.planner_budget_us = 20;
  return k;
}

}  // namespace feplb
