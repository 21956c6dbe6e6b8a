#include "feplb/core/knobs.h"

#include <algorithm>

#include "feplb/core/error.h"

namespace feplb {
namespace {

std::string flag_of(std::string_view name) {
  std::string flag = "--" + std::string(name);
  std::replace(flag.begin(), flag.end(), '_', '-');
  return flag;
}

}  // namespace

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
    FEPLB_REQUIRE_INPUT(v >= k.minimum && v <= k.maximum, "{}: {} is outside [{}, {}] {}", k.flag,
                        v, k.minimum, k.maximum, k.unit);
  }
}

void apply_knobs(Knobs& knobs, const std::vector<KnobOverride>& overrides) {
  for (const KnobOverride& o : overrides) {
    bool found = false;
    for (const KnobInfo& info : list_knobs(knobs)) {
      if (info.name != o.name) continue;
      std::visit([&](auto* p) { *p = static_cast<std::remove_reference_t<decltype(*p)>>(o.value); },
                 info.value);
      found = true;
    }
    FEPLB_REQUIRE_INPUT(found, "variant: unknown knob '{}'", o.name);
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
