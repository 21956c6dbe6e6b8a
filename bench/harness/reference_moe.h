// Reference MoE layer in float64 on the host: the ground truth GPU results are checked against.
// SwiGLU experts: y = (silu(x Wg) * (x Wu)) Wd; out[t] = sum_k w[t,k] * y_{idx[t,k]}(x[t]).
// Forward and backward (every gradient), the GPU backward's reference.
#pragma once

#include <cstdint>
#include <vector>

namespace feplb {

struct ReferenceMoe {
  int64_t hidden = 0, ffn = 0, num_experts = 0;
  // Per expert, row-major: gate|up [hidden, 2*ffn] (gate columns first), then down [ffn, hidden].
  std::vector<float> weights;  // [num_experts, 3 * hidden * ffn]

  const float* expert_weights(int64_t e) const { return weights.data() + e * 3 * hidden * ffn; }

  // One expert's output for one row x [hidden] -> y [hidden].
  void expert_forward(int64_t e, const float* x, double* y) const;
  // The layer forward: hidden [S, H], topk_idx / topk_weight [S, K] -> out [S, H].
  std::vector<double> forward(const std::vector<float>& hidden,
                              const std::vector<int32_t>& topk_idx,
                              const std::vector<float>& topk_weight, int64_t num_tokens,
                              int top_k) const;

  // The layer backward for the loss L with dL/dout = grad_out [S, H]: dL/dhidden [S, H],
  // dL/dtopk_weight [S, K], and dL/dweights laid out like `weights` [E, 3HF].
  struct Grads {
    std::vector<double> hidden, topk_weight, weights;
  };
  Grads backward(const std::vector<float>& hidden, const std::vector<int32_t>& topk_idx,
                 const std::vector<float>& topk_weight, const std::vector<double>& grad_out,
                 int64_t num_tokens, int top_k) const;
};

}  // namespace feplb
