#include "feplb/core/knobs.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "feplb/core/error.h"
#include "feplb/core/text.h"

namespace feplb {
namespace {

std::string flag_of(std::string_view name) {
  std::string flag = "--" + std::string(name);
  std::replace(flag.begin(), flag.end(), '_', '-');
  return flag;
}

[[noreturn]] void knob_error(const KnobInfo& k, const std::string& what) {
  throw InputError(fmt::format("knob {} ({}): {}", k.name, k.flag, what));
}

void require_in_range(const KnobInfo& k, double v, const std::string& text) {
  if (v < k.minimum || v > k.maximum) {
    knob_error(k,
               fmt::format("{} is outside {} {}", text, range_text(k.minimum, k.maximum), k.unit));
  }
}

// A knob value read as a number: `exact` when it is an integer that int64 holds.
struct Number {
  double value = 0;
  bool exact = false;
  int64_t integer = 0;
};

// Text as a number: an integer, else a decimal or scientific number ("inf" and "nan" included,
// refused later as not finite).
Number number_of(const KnobInfo& k, std::string_view text) {
  const char* end = text.data() + text.size();
  Number n;
  const auto [ip, iec] = std::from_chars(text.data(), end, n.integer);
  if (iec == std::errc() && ip == end) {
    n.exact = true;
    n.value = static_cast<double>(n.integer);
    return n;
  }
  const auto [dp, dec] = std::from_chars(text.data(), end, n.value);
  if (dec == std::errc::result_out_of_range && dp == end) {
    knob_error(k, fmt::format("{} is outside {} {}", printable(text),
                              range_text(k.minimum, k.maximum), k.unit));
  }
  if (dec != std::errc() || dp != end || text.empty()) {
    knob_error(k, fmt::format("'{}' is not a number", printable(text)));
  }
  return n;
}

}  // namespace

void require_knob_name(std::string_view name) {
  Knobs scratch;
  const std::vector<KnobInfo> infos = list_knobs(scratch);
  FEPLB_REQUIRE_INPUT(
      std::any_of(infos.begin(), infos.end(), [&](const KnobInfo& k) { return k.name == name; }),
      "knob {}: unknown (`feplb knobs` lists them)", printable(name));
}

void set_knob(Knobs& knobs, std::string_view name, const KnobValue& value) {
  require_knob_name(name);
  const std::vector<KnobInfo> infos = list_knobs(knobs);
  const KnobInfo& k =
      *std::find_if(infos.begin(), infos.end(), [&](const KnobInfo& i) { return i.name == name; });
  Number n;
  std::string text;
  if (const auto* i = std::get_if<int64_t>(&value)) {
    n = {static_cast<double>(*i), true, *i};
    text = fmt::format("{}", *i);
  } else if (const auto* d = std::get_if<double>(&value)) {
    n.value = *d;
    text = fmt::format("{}", *d);
  } else {
    const std::string_view t = std::get<std::string_view>(value);
    n = number_of(k, t);
    text = printable(t);
  }
  if (!std::isfinite(n.value)) knob_error(k, fmt::format("{} is not a finite number", text));
  const bool integer_knob = std::holds_alternative<int64_t*>(k.value);
  if (integer_knob && !n.exact && std::floor(n.value) != n.value) {
    knob_error(k, fmt::format("{} is not an integer", text));
  }
  require_in_range(k, n.value, text);
  if (integer_knob) {
    *std::get<int64_t*>(k.value) = n.exact ? n.integer : static_cast<int64_t>(n.value);
  } else {
    *std::get<double*>(k.value) = n.value;
  }
}

std::vector<KnobInfo> list_knobs(Knobs& knobs) {
  std::vector<KnobInfo> out;
#define FEPLB_KNOB(type, name, def, min, max, unit, help)                              \
  out.push_back(KnobInfo{#name, flag_of(#name), &knobs.name, static_cast<double>(def), \
                         static_cast<double>(min), static_cast<double>(max), unit, help});
#include "feplb/core/knobs.def"
#undef FEPLB_KNOB
  return out;
}

void validate_knobs(const Knobs& knobs) {
  Knobs copy = knobs;
  for (const KnobInfo& k : list_knobs(copy)) {
    const double v = std::visit([](auto* p) { return static_cast<double>(*p); }, k.value);
    if (!std::isfinite(v)) knob_error(k, fmt::format("{} is not a finite number", v));
    require_in_range(k, v, fmt::format("{}", v));
  }
}

void apply_knobs(Knobs& knobs, const std::vector<KnobOverride>& overrides) {
  for (const KnobOverride& o : overrides) {
    set_knob(knobs, o.name, o.value);
  }
}

KnobOverride parse_knob_override(const std::string& kv) {
  const size_t eq = kv.find('=');
  FEPLB_REQUIRE_INPUT(eq != std::string::npos && eq > 0, "--knob: '{}' is not NAME=VALUE", kv);
  char* end = nullptr;
  const double v = std::strtod(kv.c_str() + eq + 1, &end);
  FEPLB_REQUIRE_INPUT(end && *end == '\0' && end != kv.c_str() + eq + 1, "--knob: '{}': bad value",
                      kv);
  return {kv.substr(0, eq), v};
}

}  // namespace feplb
