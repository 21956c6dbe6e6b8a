// Knob overrides by name, as the benchmarks' --knob NAME=VALUE gives them.
#include "feplb/core/knobs.h"

#include <gtest/gtest.h>

#include "feplb/core/error.h"

namespace feplb {
namespace {

TEST(Knobs, OverrideParsesAndApplies) {
  Knobs k;
  apply_knobs(k, {parse_knob_override("min_slice_rows=512"),
                  parse_knob_override("balance_tolerance=0.02")});
  EXPECT_EQ(k.min_slice_rows, 512);
  EXPECT_DOUBLE_EQ(k.balance_tolerance, 0.02);
  validate_knobs(k);
}

TEST(Knobs, BadOverridesAreInputErrors) {
  for (const char* bad :
       {"min_slice_rows", "=3", "min_slice_rows=", "min_slice_rows=3x", "dyn=four"}) {
    EXPECT_THROW(parse_knob_override(bad), InputError) << bad;
  }
  Knobs k;
  EXPECT_THROW(apply_knobs(k, {parse_knob_override("no_such_knob=1")}), InputError);
  apply_knobs(k, {parse_knob_override("min_slice_rows=0")});
  EXPECT_THROW(validate_knobs(k), InputError);  // below its minimum of 1
}

}  // namespace
}  // namespace feplb
