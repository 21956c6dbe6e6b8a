#include "feplb/core/reference_moe.h"

#include <cmath>

#include "feplb/core/error.h"

namespace feplb {

void ReferenceMoe::expert_forward(int64_t e, const float* x, double* y) const {
  const int64_t H = hidden, F = ffn;
  const float* w_gu = expert_weights(e);          // [H, 2F]
  const float* w_down = w_gu + 2 * H * F;         // [F, H]
  std::vector<double> gu(static_cast<size_t>(2 * F), 0.0);
  for (int64_t i = 0; i < H; ++i) {
    const double xi = x[i];
    const float* row = w_gu + i * 2 * F;
    for (int64_t j = 0; j < 2 * F; ++j) gu[j] += xi * row[j];
  }
  for (int64_t j = 0; j < H; ++j) y[j] = 0.0;
  for (int64_t f = 0; f < F; ++f) {
    const double g = gu[f], u = gu[F + f];
    const double a = g / (1.0 + std::exp(-g)) * u;
    const float* row = w_down + f * H;
    for (int64_t j = 0; j < H; ++j) y[j] += a * row[j];
  }
}

std::vector<double> ReferenceMoe::forward(const std::vector<float>& x, const std::vector<int32_t>& idx,
                                          const std::vector<float>& w, int64_t S, int K) const {
  FEPLB_CHECK(static_cast<int64_t>(x.size()) == S * hidden, "hidden has {} values", x.size());
  FEPLB_CHECK(static_cast<int64_t>(idx.size()) == S * K && w.size() == idx.size(), "top-k shapes");
  std::vector<double> out(static_cast<size_t>(S * hidden), 0.0), y(static_cast<size_t>(hidden));
  for (int64_t t = 0; t < S; ++t) {
    for (int k = 0; k < K; ++k) {
      const int32_t e = idx[t * K + k];
      FEPLB_CHECK(e >= 0 && e < num_experts, "expert {} out of range", e);
      expert_forward(e, x.data() + t * hidden, y.data());
      for (int64_t j = 0; j < hidden; ++j) out[t * hidden + j] += w[t * K + k] * y[j];
    }
  }
  return out;
}

}  // namespace feplb
