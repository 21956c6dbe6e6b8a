// Checked reading of JSON input files (traces, placements), private to feplb_core: parsing with a
// depth limit, and members and integers whose errors name the field. Every error is an InputError.
#pragma once

#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "feplb/core/error.h"

namespace feplb::json_input {

// Ordered: objects keep the file's key order.
using json = nlohmann::ordered_json;

// Documents nest a few levels; deeper ones are refused while parsing, so that nothing that walks
// the document recursively (dump, copy) can exhaust the stack.
inline constexpr int kMaxDepth = 64;

inline const char* type_of(const json& v) { return v.type_name(); }

// Parses `text`; "malformed JSON: ..." on bad syntax, numbers beyond a double, or deep nesting.
inline json parse_document(std::string_view text) {
  try {
    const json::parser_callback_t depth_limit = [](int depth, json::parse_event_t, json&) {
      FEPLB_REQUIRE_INPUT(depth <= kMaxDepth, "malformed JSON: nested deeper than {} levels",
                          kMaxDepth);
      return true;
    };
    return json::parse(text.begin(), text.end(), depth_limit);
  } catch (const json::exception& e) {
    // parse_error for bad syntax, out_of_range for numbers beyond a double (1e400).
    std::string what = e.what();
    if (auto pos = what.find("] "); pos != std::string::npos) what = what.substr(pos + 2);
    throw InputError("malformed JSON: " + what);
  }
}

// obj[key]; "{where}{key}: missing" when absent.
inline const json& member(const json& obj, const char* key, std::string_view where) {
  auto it = obj.find(key);
  FEPLB_REQUIRE_INPUT(it != obj.end(), "{}{}: missing", where, key);
  return *it;
}

// An integer in [lo, hi]; `field` names it in the error.
inline int64_t int_in(const json& v, std::string_view field, int64_t lo, int64_t hi) {
  FEPLB_REQUIRE_INPUT(v.is_number_integer(), "{}: expected an integer, got {}{}", field, type_of(v),
                      v.is_number() ? " " + v.dump() : std::string());
  FEPLB_REQUIRE_INPUT(
      !(v.is_number_unsigned() &&
        v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())),
      "{}: {} is too large", field, v.dump());
  const int64_t x = v.get<int64_t>();
  FEPLB_REQUIRE_INPUT(x >= lo && x <= hi, "{}: {} is outside [{}, {}]", field, x, lo, hi);
  return x;
}

// An array; "{field}: expected an array, got ..." otherwise.
inline const json& array_at(const json& v, std::string_view field) {
  FEPLB_REQUIRE_INPUT(v.is_array(), "{}: expected an array, got {}", field, type_of(v));
  return v;
}

}  // namespace feplb::json_input
