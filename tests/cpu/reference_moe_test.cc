// The float64 reference MoE (the GPU tests' ground truth) against a hand-computed expert, and
// bf16 rounding.
#include <gtest/gtest.h>

#include <cmath>

#include "feplb/core/bf16.h"
#include "feplb/core/reference_moe.h"

namespace feplb {
namespace {

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f)), 1.0f);
  EXPECT_EQ(round_to_bf16(1.0f + 1.0f / 256), 1.0f);           // tie -> even (1.0)
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
