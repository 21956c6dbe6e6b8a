// Knobs: the tunables of feplb as one plain struct, built from knobs.def (declared once there).
// Also a visitor so the CLI and the docs can list every knob without repeating it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "feplb/core/limits.h"

namespace feplb {

struct Knobs {
#define FEPLB_KNOB(type, name, def, min, max, unit, help) type name = def;
#include "feplb/core/knobs.def"
#undef FEPLB_KNOB
};

// One knob, described for listing and binding: `value` points into a Knobs object.
struct KnobInfo {
  std::string_view name;  // e.g. "max_num_dyn"
  std::string flag;       // e.g. "--max-num-dyn"
  std::variant<int64_t*, double*> value;
  double default_value;
  double minimum;
  double maximum;
  std::string_view unit;
  std::string_view help;
};

// Every knob of `knobs`, in declaration order.
std::vector<KnobInfo> list_knobs(Knobs& knobs);

// A knob's value as a front end has it: an integer, a floating-point number, or text (a
// command-line argument, or a number too large for int64, as Python or JSON wrote it).
using KnobValue = std::variant<int64_t, double, std::string_view>;

// Sets the knob `name` (as in knobs.def, e.g. "max_num_dyn") to `value`: the one parser of the
// CLI, the Python module and the C API. An integer knob takes an integral value (4, 4.0, "4",
// "4e0"); every knob a finite one within [minimum, maximum]. Otherwise InputError, one line:
//   knob NAME (--FLAG): VALUE is not a number | is not a finite number | is not an integer
//   knob NAME (--FLAG): VALUE is outside [MIN, MAX] UNIT
//   knob NAME: unknown (`feplb knobs` lists them)
void set_knob(Knobs& knobs, std::string_view name, const KnobValue& value);
// InputError "knob NAME: unknown (...)" unless `name` is a knob.
void require_knob_name(std::string_view name);

// Throws InputError, in set_knob's format, if a knob is outside [minimum, maximum] (or not finite).
void validate_knobs(const Knobs& knobs);

// One knob set by name (reports' variants).
struct KnobOverride {
  std::string name;  // as in knobs.def, e.g. "balance_tolerance"
  double value = 0;
};
// Sets each named knob with set_knob (and its errors).
void apply_knobs(Knobs& knobs, const std::vector<KnobOverride>& overrides);
// "NAME=VALUE" (a benchmark's --knob) -> override; InputError naming the text otherwise.
KnobOverride parse_knob_override(const std::string& name_eq_value);

}  // namespace feplb
