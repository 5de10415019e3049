#include "codecs/cpu/momentum.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace gradcomp::codecs {
namespace {

std::vector<float> Copy(absl::Span<const float> s) {
  return std::vector<float>(s.begin(), s.end());
}

TEST(ClipScaleTest, ClipsOnlyAboveTheNorm) {
  const std::vector<float> g = {3, 4};  // norm 5
  EXPECT_FLOAT_EQ(ClipScale(g, 1.0), 0.2f);
  EXPECT_FLOAT_EQ(ClipScale(g, 5.0), 1.0f);
  EXPECT_FLOAT_EQ(ClipScale(g, 10.0), 1.0f);
  EXPECT_FLOAT_EQ(ClipScale(g, 0.0), 1.0f);
  EXPECT_FLOAT_EQ(ClipScale(std::vector<float>(4, 0.0f), 1.0), 1.0f);
}

TEST(ClipScaleTest, ClipsAFiniteGradientWhoseSquaresOverflowFp32) {
  // 2e19^2 overflows fp32; a norm of 2e19 must still clip to clip_norm, not
  // scale by clip / Inf = 0 and drop the gradient.
  std::vector<float> g(1024, 1.0f);
  g[10] = 2e19f;
  const float scale = ClipScale(g, 0.5);
  ASSERT_GT(scale, 0.0f);
  double clipped = 0;
  for (float v : g) clipped += static_cast<double>(scale * v) * (scale * v);
  EXPECT_NEAR(std::sqrt(clipped), 0.5, 1e-6);
}

TEST(MomentumCorrectionTest, ClassicAccumulatesMomentumIntoVelocity) {
  TensorState state;
  const MomentumCorrection mc(MomentumCorrection::Options{0.5f, false});
  const std::vector<float> g1 = {1, -2, 4};
  const std::vector<float> g2 = {2, 2, -2};
  mc.Accumulate(g1, 1.0f, state);
  const std::vector<float> v = Copy(mc.Accumulate(g2, 0.5f, state));
  // u1 = g1; v1 = g1; u2 = 0.5 u1 + 0.5 g2; v2 = v1 + u2.
  const std::vector<float> u2 = {1.5f, 0.0f, 1.0f};
  EXPECT_EQ(Copy(*state.Find(MomentumCorrection::kMomentumBuffer)), u2);
  EXPECT_EQ(v, (std::vector<float>{2.5f, -2.0f, 5.0f}));
}

TEST(MomentumCorrectionTest, NesterovAddsTheGradientOnTop) {
  TensorState state;
  const MomentumCorrection mc(MomentumCorrection::Options{0.5f, true});
  const std::vector<float> g1 = {2, -4};
  const std::vector<float> g2 = {4, 0};
  mc.Accumulate(g1, 1.0f, state);
  // u1 = 0.5 g1 = {1, -2}; v1 = u1 + g1 = {3, -6}.
  EXPECT_EQ(Copy(*state.Find(MomentumCorrection::kVelocityBuffer)),
            (std::vector<float>{3, -6}));
  mc.Accumulate(g2, 1.0f, state);
  // u2 = (u1 + g2) * 0.5 = {2.5, -1}; v2 = v1 + u2 + g2 = {9.5, -7}.
  EXPECT_EQ(Copy(*state.Find(MomentumCorrection::kMomentumBuffer)),
            (std::vector<float>{2.5f, -1.0f}));
  EXPECT_EQ(Copy(*state.Find(MomentumCorrection::kVelocityBuffer)),
            (std::vector<float>{9.5f, -7.0f}));
}

TEST(MomentumCorrectionTest, SentClearsVelocityAndMasksMomentum) {
  const std::vector<float> g = {1, 2, 3, 4};
  const std::vector<uint32_t> sent = {1, 3};
  for (bool masking : {false, true}) {
    TensorState state;
    const MomentumCorrection mc(MomentumCorrection::Options{0.9f, false});
    mc.Accumulate(g, 1.0f, state);
    mc.Sent(sent, masking, state);
    EXPECT_EQ(Copy(*state.Find(MomentumCorrection::kVelocityBuffer)),
              (std::vector<float>{1, 0, 3, 0}));
    const std::vector<float> masked = {1, 0, 3, 0};
    EXPECT_EQ(Copy(*state.Find(MomentumCorrection::kMomentumBuffer)),
              masking ? masked : g);
  }
}

TEST(MomentumCorrectionTest, LargeTensorTakesTheParallelPathIdentically) {
  const size_t n = 3'000'001;
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) g[i] = static_cast<float>(i % 97) - 48.0f;
  TensorState state;
  const MomentumCorrection mc(MomentumCorrection::Options{0.9f, false});
  mc.Accumulate(g, 1.0f, state);
  const absl::Span<const float> v = mc.Accumulate(g, 1.0f, state);
  for (size_t i = 0; i < n; ++i) {
    const float u2 = 0.9f * g[i] + g[i];
    ASSERT_EQ(v[i], g[i] + u2) << i;
  }
}

}  // namespace
}  // namespace gradcomp::codecs
