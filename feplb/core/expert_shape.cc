#include "feplb/core/expert_shape.h"

#include <algorithm>
#include <array>
#include <cctype>

#include "feplb/core/error.h"

namespace feplb {
namespace {

struct Preset {
  std::string_view prefix;
  ExpertShape shape;
};

// Shapes from FEPLB.md §5 and the models' public configs.
constexpr std::array<Preset, 4> kPresets{{
    {"glm5", {6144, 2048, 2}},
    {"qwen3-235b", {4096, 1536, 2}},
    {"olmoe", {2048, 1024, 2}},
    {"mixtral-8x7b", {4096, 14336, 2}},
}};

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

}  // namespace

std::string ExpertShape::describe() const {
  return fmt::format("H={} F={} SwiGLU {} ({:.1f} MiB per expert)", hidden, ffn,
                     dtype_name(dtype_bytes), static_cast<double>(weight_bytes()) / (1 << 20));
}

std::optional<ExpertShape> shape_for_model(std::string_view model) {
  const std::string m = lower(model);
  for (const Preset& p : kPresets) {
    if (m.rfind(p.prefix, 0) == 0) return p.shape;
  }
  return std::nullopt;
}

int64_t dtype_bytes_of(std::string_view dtype) {
  if (dtype == "bf16" || dtype == "fp16") return 2;
  if (dtype == "fp8") return 1;
  if (dtype == "fp32") return 4;
  throw InputError(fmt::format("dtype: '{}' is not one of bf16, fp16, fp8, fp32", dtype));
}

std::string_view dtype_name(int64_t dtype_bytes) {
  switch (dtype_bytes) {
    case 1: return "fp8";
    case 2: return "bf16";
    case 4: return "fp32";
    default: return "?";
  }
}

}  // namespace feplb
