// A rank's experts as a framework holds them: weights (bf16) and fp32 gradients in device memory
// the caller owns, one buffer each, with the per-expert views MoeLayer takes.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "feplb/cuda/base/resources.h"
#include "feplb/cuda/gemm/expert_ffn.h"
#include "feplb/cuda/moe_layer.h"

namespace feplb::cuda {

class LocalExperts {
 public:
  // `experts` experts of hidden H and ffn F: weights [experts, 3HF] (per expert gate|up [H, 2F]
  // then down [F, H], row-major) and, with `grads`, fp32 gradients laid out alike.
  LocalExperts(int experts, int64_t hidden, int64_t ffn, bool grads)
      : elems_(expert_weight_elems(hidden, ffn)),
        gate_up_elems_(2 * hidden * ffn),
        weights_(static_cast<size_t>(experts * elems_)),
        grads_(grads ? static_cast<size_t>(experts * elems_) : 0) {
    for (int e = 0; e < experts; ++e) {
      const int64_t base = e * elems_;
      params_.push_back({weights_.get() + base, weights_.get() + base + gate_up_elems_});
      if (grads) grad_views_.push_back({grads_.get() + base, grads_.get() + base + gate_up_elems_});
    }
  }
  bf16* weights() const { return weights_.get(); }
  float* grads() const { return grads_.get(); }
  int64_t weight_elems() const { return static_cast<int64_t>(weights_.size()); }
  size_t grad_bytes() const { return grads_.bytes(); }
  std::span<const ExpertParams> params() const { return params_; }
  std::span<const ExpertGrads> grad_views() const { return grad_views_; }

 private:
  int64_t elems_, gate_up_elems_;
  DeviceBuffer<bf16> weights_;
  DeviceBuffer<float> grads_;
  std::vector<ExpertParams> params_;
  std::vector<ExpertGrads> grad_views_;
};

}  // namespace feplb::cuda
