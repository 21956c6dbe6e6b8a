// The knob parser every front end uses (set_knob), and overrides by name as the benchmarks'
// --knob NAME=VALUE gives them.
#include "feplb/core/knobs.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "feplb/core/error.h"

namespace feplb {
namespace {

// The message set_knob throws for `value`, or "" when it accepts it.
std::string knob_error(std::string_view name, const KnobValue& value) {
  Knobs k;
  try {
    set_knob(k, name, value);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(Knobs, SetKnobTakesEveryFormOfAValidValue) {
  Knobs k;
  set_knob(k, "max_num_dyn", int64_t{6});
  EXPECT_EQ(k.max_num_dyn, 6);
  set_knob(k, "max_num_dyn", 7.0);  // integral: fine for an integer knob
  EXPECT_EQ(k.max_num_dyn, 7);
  set_knob(k, "max_num_dyn", std::string_view("5"));
  EXPECT_EQ(k.max_num_dyn, 5);
  set_knob(k, "max_num_dyn", std::string_view("1e1"));
  EXPECT_EQ(k.max_num_dyn, 10);
  set_knob(k, "balance_tolerance", std::string_view("0.02"));
  EXPECT_DOUBLE_EQ(k.balance_tolerance, 0.02);
  set_knob(k, "balance_tolerance", int64_t{1});
  EXPECT_DOUBLE_EQ(k.balance_tolerance, 1.0);
  validate_knobs(k);
}

TEST(Knobs, SetKnobRefusesBadValuesInOneFormat) {
  EXPECT_EQ(knob_error("max_num_dyn", 2.5),
            "knob max_num_dyn (--max-num-dyn): 2.5 is not an integer");
  EXPECT_EQ(knob_error("max_num_dyn", std::string_view("2.5")),
            "knob max_num_dyn (--max-num-dyn): 2.5 is not an integer");
  EXPECT_EQ(knob_error("max_num_dyn", int64_t{-1}),
            "knob max_num_dyn (--max-num-dyn): -1 is outside [0, 65536] experts");
  EXPECT_EQ(knob_error("max_num_dyn", std::string_view("-1")),
            "knob max_num_dyn (--max-num-dyn): -1 is outside [0, 65536] experts");
  EXPECT_EQ(knob_error("max_num_dyn", -1.0),
            "knob max_num_dyn (--max-num-dyn): -1 is outside [0, 65536] experts");
  EXPECT_EQ(knob_error("max_num_dyn", std::string_view("99999999999999999999999")),
            "knob max_num_dyn (--max-num-dyn): 99999999999999999999999 is outside [0, 65536] "
            "experts");
  EXPECT_EQ(knob_error("balance_tolerance", std::numeric_limits<double>::infinity()),
            "knob balance_tolerance (--balance-tolerance): inf is not a finite number");
  EXPECT_EQ(knob_error("balance_tolerance", std::string_view("inf")),
            "knob balance_tolerance (--balance-tolerance): inf is not a finite number");
  EXPECT_EQ(knob_error("balance_tolerance", std::nan("")),
            "knob balance_tolerance (--balance-tolerance): nan is not a finite number");
  EXPECT_EQ(knob_error("balance_tolerance", std::string_view("1e400")),
            "knob balance_tolerance (--balance-tolerance): 1e400 is outside [0, 1] x mean load");
  EXPECT_EQ(knob_error("balance_tolerance", std::string_view("2")),
            "knob balance_tolerance (--balance-tolerance): 2 is outside [0, 1] x mean load");
  EXPECT_EQ(knob_error("balance_tolerance", std::string_view("0.5x")),
            "knob balance_tolerance (--balance-tolerance): '0.5x' is not a number");
  EXPECT_EQ(knob_error("balance_tolerance", std::string_view("")),
            "knob balance_tolerance (--balance-tolerance): '' is not a number");
  EXPECT_EQ(knob_error("max_num_dynn", int64_t{1}),
            "knob max_num_dynn: unknown (`feplb knobs` lists them)");
  // A refused value leaves the knob as it was.
  Knobs k;
  EXPECT_THROW(set_knob(k, "max_num_dyn", 2.5), InputError);
  EXPECT_EQ(k.max_num_dyn, Knobs{}.max_num_dyn);
}

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
  EXPECT_THROW(apply_knobs(k, {parse_knob_override("min_slice_rows=0")}), InputError);
  EXPECT_THROW(apply_knobs(k, {parse_knob_override("min_slice_rows=1.5")}), InputError);
  k.min_slice_rows = 0;                         // set directly: validate_knobs catches it
  EXPECT_THROW(validate_knobs(k), InputError);  // below its minimum of 1
}

}  // namespace
}  // namespace feplb
