// The float64 reference MoE (the GPU tests' ground truth) against a hand-computed expert, and
// bf16 rounding.
#include "bench/harness/reference_moe.h"

#include <gtest/gtest.h>

#include <cmath>

#include "feplb/core/bf16.h"

namespace feplb {
namespace {

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f)), 1.0f);
  EXPECT_EQ(round_to_bf16(1.0f + 1.0f / 256), 1.0f);               // tie -> even (1.0)
  EXPECT_EQ(round_to_bf16(1.0f + 3.0f / 256), 1.0f + 4.0f / 256);  // tie -> even (1 + 2^-6)
  EXPECT_EQ(round_to_bf16(-2.5f), -2.5f);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(NAN))));
}

TEST(ReferenceMoe, OneExpertByHand) {
  // H = 1, F = 1: gate g = 2x, up u = 3x, down d = 5: y = silu(2x) * 3x * 5.
  ReferenceMoe m{1, 1, 2, {2, 3, 5, /*expert 1*/ 1, 1, 1}};
  const double x = 0.7;
  const double g = 2 * x, expected = g / (1 + std::exp(-g)) * 3 * x * 5;
  double y = 0;
  const float xf = static_cast<float>(x);
  m.expert_forward(0, &xf, &y);
  EXPECT_NEAR(y, expected, 1e-6);
  // Weighted sum over top-2: 0.25 * expert 0 + 0.75 * expert 1.
  const auto out = m.forward({xf}, {0, 1}, {0.25f, 0.75f}, 1, 2);
  double y1 = 0;
  m.expert_forward(1, &xf, &y1);
  EXPECT_NEAR(out[0], 0.25 * y + 0.75 * y1, 1e-12);
}

}  // namespace
}  // namespace feplb

namespace feplb {
namespace {

// Every analytic gradient of the reference backward against central finite differences of
// L = <grad_out, forward(...)> on a small random layer (double precision, relative 1e-6).
TEST(ReferenceMoe, BackwardMatchesFiniteDifferences) {
  const int64_t H = 4, F = 3, S = 3;
  const int E = 3, K = 2;
  ReferenceMoe m{H, F, E, {}};
  uint64_t state = 12345;
  auto rnd = [&] {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<float>(static_cast<double>(state >> 11) * 0x1.0p-53 * 2.0 - 1.0);
  };
  m.weights.resize(static_cast<size_t>(E * 3 * H * F));
  for (float& v : m.weights) v = rnd();
  std::vector<float> x(static_cast<size_t>(S * H)), w = {0.7f, 0.3f, 0.5f, 0.5f, 0.9f, 0.1f};
  for (float& v : x) v = rnd();
  const std::vector<int32_t> idx = {0, 2, 1, 2, 2, 0};
  std::vector<double> dout(static_cast<size_t>(S * H));
  for (double& v : dout) v = rnd();
  const auto g = m.backward(x, idx, w, dout, S, K);
  auto loss = [&](const ReferenceMoe& mm, const std::vector<float>& xx,
                  const std::vector<float>& ww) {
    const auto out = mm.forward(xx, idx, ww, S, K);
    double l = 0;
    for (size_t i = 0; i < out.size(); ++i) l += out[i] * dout[i];
    return l;
  };
  // Perturbations are exact in float (powers of two), so the differences are clean.
  const float h = 1.0f / 1024;
  auto check = [&](double analytic, double numeric, const char* what, size_t i) {
    EXPECT_NEAR(analytic, numeric, 1e-6 * std::max(1.0, std::abs(numeric)))
        << what << "[" << i << "]";
  };
  for (size_t i = 0; i < x.size(); ++i) {
    auto xp = x, xm = x;
    xp[i] += h;
    xm[i] -= h;
    check(g.hidden[i], (loss(m, xp, w) - loss(m, xm, w)) / (2.0 * h), "hidden", i);
  }
  for (size_t i = 0; i < w.size(); ++i) {
    auto wp = w, wm = w;
    wp[i] += h;
    wm[i] -= h;
    check(g.topk_weight[i], (loss(m, x, wp) - loss(m, x, wm)) / (2.0 * h), "topk_weight", i);
  }
  for (size_t i = 0; i < m.weights.size(); ++i) {
    ReferenceMoe mp = m, mm = m;
    mp.weights[i] += h;
    mm.weights[i] -= h;
    check(g.weights[i], (loss(mp, x, w) - loss(mm, x, w)) / (2.0 * h), "weights", i);
  }
}

}  // namespace
}  // namespace feplb
