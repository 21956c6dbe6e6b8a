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

// Expert shapes (hidden H, per-expert FFN F) from the models' public configs: GLM-5 H=6144
// F=2048, Qwen3-235B-A22B H=4096 F=1536, OLMoE-1B-7B H=2048 F=1024, Mixtral-8x7B H=4096 F=14336.
constexpr std::array<Preset, 4> kPresets{{
    {"glm5", {6144, 2048, Dtype::kBf16}},
    {"qwen3-235b", {4096, 1536, Dtype::kBf16}},
    {"olmoe", {2048, 1024, Dtype::kBf16}},
    {"mixtral-8x7b", {4096, 14336, Dtype::kBf16}},
}};

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

}  // namespace

std::string ExpertShape::describe() const {
  return fmt::format("H={} F={} SwiGLU {} ({:.1f} MiB per expert)", hidden, ffn, dtype_name(dtype),
                     static_cast<double>(weight_bytes()) / (1 << 20));
}

std::optional<ExpertShape> shape_for_model(std::string_view model) {
  const std::string m = lower(model);
  for (const Preset& p : kPresets) {
    if (m.rfind(p.prefix, 0) == 0) return p.shape;
  }
  return std::nullopt;
}

std::vector<std::pair<std::string_view, ExpertShape>> known_model_shapes() {
  std::vector<std::pair<std::string_view, ExpertShape>> out;
  for (const Preset& p : kPresets) out.emplace_back(p.prefix, p.shape);
  return out;
}

ExpertShape default_shape() { return kPresets[0].shape; }

int64_t ExpertShape::dtype_bytes() const {
  switch (dtype) {
    case Dtype::kFp8:
      return 1;
    case Dtype::kFp32:
      return 4;
    case Dtype::kBf16:
    case Dtype::kFp16:
      return 2;
  }
  return 2;
}

Dtype parse_dtype(std::string_view name, std::string_view field) {
  if (name == "bf16") return Dtype::kBf16;
  if (name == "fp16") return Dtype::kFp16;
  if (name == "fp8") return Dtype::kFp8;
  if (name == "fp32") return Dtype::kFp32;
  throw InputError(fmt::format("{}: '{}' is not one of bf16, fp16, fp8, fp32", field, name));
}

std::string_view dtype_name(Dtype dtype) {
  switch (dtype) {
    case Dtype::kBf16:
      return "bf16";
    case Dtype::kFp16:
      return "fp16";
    case Dtype::kFp8:
      return "fp8";
    case Dtype::kFp32:
      return "fp32";
  }
  return "?";
}

}  // namespace feplb
