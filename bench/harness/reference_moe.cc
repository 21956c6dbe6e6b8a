#include "bench/harness/reference_moe.h"

#include <algorithm>
#include <cmath>

#include "feplb/core/error.h"

namespace feplb {

void ReferenceMoe::expert_forward(int64_t e, const float* x, double* y) const {
  const int64_t H = hidden, F = ffn;
  const float* w_gu = expert_weights(e);   // [H, 2F]
  const float* w_down = w_gu + 2 * H * F;  // [F, H]
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

std::vector<double> ReferenceMoe::forward(const std::vector<float>& x,
                                          const std::vector<int32_t>& idx,
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

ReferenceMoe::Grads ReferenceMoe::backward(const std::vector<float>& x,
                                           const std::vector<int32_t>& idx,
                                           const std::vector<float>& w,
                                           const std::vector<double>& dout, int64_t S,
                                           int K) const {
  const int64_t H = hidden, F = ffn;
  FEPLB_CHECK(static_cast<int64_t>(dout.size()) == S * H, "grad_out has {} values", dout.size());
  Grads g;
  g.hidden.assign(static_cast<size_t>(S * H), 0.0);
  g.topk_weight.assign(static_cast<size_t>(S * K), 0.0);
  g.weights.assign(weights.size(), 0.0);
  std::vector<double> gu(static_cast<size_t>(2 * F)), a(static_cast<size_t>(F)),
      y(static_cast<size_t>(H)), dy(static_cast<size_t>(H)), da(static_cast<size_t>(F)),
      dgu(static_cast<size_t>(2 * F));
  for (int64_t t = 0; t < S; ++t) {
    const float* xt = x.data() + t * H;
    const double* dot = dout.data() + t * H;
    for (int k = 0; k < K; ++k) {
      const int32_t e = idx[t * K + k];
      FEPLB_CHECK(e >= 0 && e < num_experts, "expert {} out of range", e);
      const float* w_gu = expert_weights(e);   // [H, 2F]
      const float* w_down = w_gu + 2 * H * F;  // [F, H]
      double* g_gu = g.weights.data() + e * 3 * H * F;
      double* g_down = g_gu + 2 * H * F;
      // Forward again: gate|up, activation, output.
      std::fill(gu.begin(), gu.end(), 0.0);
      for (int64_t i = 0; i < H; ++i) {
        for (int64_t j = 0; j < 2 * F; ++j)
          gu[j] += static_cast<double>(xt[i]) * w_gu[i * 2 * F + j];
      }
      std::fill(y.begin(), y.end(), 0.0);
      for (int64_t f = 0; f < F; ++f) {
        const double sig = 1.0 / (1.0 + std::exp(-gu[f]));
        a[f] = gu[f] * sig * gu[F + f];
        for (int64_t j = 0; j < H; ++j) y[j] += a[f] * w_down[f * H + j];
      }
      // out_t += w_tk * y:  dL/dw_tk = <dout_t, y>,  dL/dy = w_tk * dout_t.
      double dw = 0.0;
      for (int64_t j = 0; j < H; ++j) {
        dw += dot[j] * y[j];
        dy[j] = w[t * K + k] * dot[j];
      }
      g.topk_weight[t * K + k] = dw;
      // y = a Wd:  dWd += a^T dy,  da = dy Wd^T.
      for (int64_t f = 0; f < F; ++f) {
        double s = 0.0;
        for (int64_t j = 0; j < H; ++j) {
          g_down[f * H + j] += a[f] * dy[j];
          s += dy[j] * w_down[f * H + j];
        }
        da[f] = s;
      }
      // a = silu(g) * u:  du = da silu(g),  dg = da u silu'(g),  silu' = sig (1 + g (1 - sig)).
      for (int64_t f = 0; f < F; ++f) {
        const double gf = gu[f], sig = 1.0 / (1.0 + std::exp(-gf));
        dgu[F + f] = da[f] * gf * sig;
        dgu[f] = da[f] * gu[F + f] * sig * (1.0 + gf * (1.0 - sig));
      }
      // gu = x Wgu:  dWgu += x^T dgu,  dx += dgu Wgu^T.
      double* dxt = g.hidden.data() + t * H;
      for (int64_t i = 0; i < H; ++i) {
        double s = 0.0;
        for (int64_t j = 0; j < 2 * F; ++j) {
          g_gu[i * 2 * F + j] += static_cast<double>(xt[i]) * dgu[j];
          s += dgu[j] * w_gu[i * 2 * F + j];
        }
        dxt[i] += s;
      }
    }
  }
  return g;
}

}  // namespace feplb
