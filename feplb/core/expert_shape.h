// ExpertShape: the size of one SwiGLU expert (gate and up: hidden x ffn, down: ffn x hidden),
// which sets the bytes a weight copy moves, the bytes of a token row and the GEMM FLOPs.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace feplb {

enum class Dtype : uint8_t { kBf16, kFp16, kFp8, kFp32 };

struct ExpertShape {
  int64_t hidden = 0;  // H
  int64_t ffn = 0;     // F (per-expert intermediate size)
  Dtype dtype = Dtype::kBf16;

  int64_t dtype_bytes() const;
  int64_t weight_bytes() const { return 3 * hidden * ffn * dtype_bytes(); }
  int64_t row_bytes() const { return hidden * dtype_bytes(); }
  // Forward FLOPs of one token-expert row: gate+up (2*H*2F) and down (2*F*H).
  double flops_per_row() const {
    return 6.0 * static_cast<double>(hidden) * static_cast<double>(ffn);
  }
  std::string describe() const;
};

// Known model shapes by name ("glm5-128e", "qwen3-235b", "olmoe-1b-7b", "mixtral-8x7b"), matched
// case-insensitively as a prefix of `model`; nullopt when unknown.
std::optional<ExpertShape> shape_for_model(std::string_view model);
// The known model names (the prefixes shape_for_model matches), with their shapes.
std::vector<std::pair<std::string_view, ExpertShape>> known_model_shapes();
// The expert shape of the default model (glm5-128e), for traces and reports that name none.
ExpertShape default_shape();

// Parses "bf16", "fp16", "fp8" or "fp32"; throws InputError naming `field` otherwise.
Dtype parse_dtype(std::string_view name, std::string_view field);
std::string_view dtype_name(Dtype dtype);

}  // namespace feplb
