#include "feplb/core/text.h"

#include <fmt/format.h>

#include <cmath>

namespace feplb {
namespace {

// Length of the valid UTF-8 sequence starting at s[i] (1 for ASCII), or 0 if it is not one.
size_t utf8_length(std::string_view s, size_t i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) return 1;
  size_t n = 0;
  uint32_t cp = 0, min = 0;
  if ((b0 & 0xE0) == 0xC0) {
    n = 2, cp = b0 & 0x1F, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    n = 3, cp = b0 & 0x0F, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    n = 4, cp = b0 & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return n;
}

}  // namespace

std::string printable(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    const size_t n = utf8_length(s, i);
    if (n == 0) {
      out += fmt::format("\\x{:02x}", b);
      ++i;
    } else if (n == 1 && (b < 0x20 || b == 0x7F)) {
      out += fmt::format("\\x{:02x}", b);
      ++i;
    } else if (n == 2 && b == 0xC2 && static_cast<unsigned char>(s[i + 1]) < 0xA0) {
      out += fmt::format("\\u{:04x}", static_cast<unsigned char>(s[i + 1]));  // C1 control
      i += 2;
    } else {
      out.append(s.substr(i, n));
      i += n;
    }
  }
  return out;
}

std::string range_text(double lo, double hi) {
  const auto num = [](double v) {
    if (v >= 1e9 && std::exp2(std::round(std::log2(v))) == v) {
      return fmt::format("2^{:.0f}", std::log2(v));
    }
    if (v + 1 >= 1e9 && std::exp2(std::round(std::log2(v + 1))) == v + 1) {
      return fmt::format("2^{:.0f}-1", std::log2(v + 1));
    }
    if (v == std::floor(v) && std::fabs(v) < 1e15) return fmt::format("{:.0f}", v);
    return fmt::format("{}", v);
  };
  return fmt::format("[{}, {}]", num(lo), num(hi));
}

}  // namespace feplb
