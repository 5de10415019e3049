#include "codecs/testing/random_inputs.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace gradcomp::codecs::testing {
namespace {

TEST(RandomInputsTest, NormalIsFixedBySeedAndScaledByStddev) {
  const std::vector<float> a = Normal(1000, 5);
  EXPECT_EQ(Normal(1000, 5), a);
  EXPECT_NE(Normal(1000, 6), a);
  // The same draws, scaled: tests of different spreads share their seeds.
  const std::vector<float> scaled = Normal(1000, 5, 0.5f);
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(scaled[i], 0.5f * a[i]);
  double sum = 0, squares = 0;
  for (float x : a) {
    sum += x;
    squares += static_cast<double>(x) * x;
  }
  // Mean and variance of 1000 standard normal draws, within 4 sigma.
  EXPECT_NEAR(sum / 1000, 0.0, 4 * std::sqrt(1.0 / 1000));
  EXPECT_NEAR(squares / 1000, 1.0, 4 * std::sqrt(2.0 / 1000));
}

TEST(RandomInputsTest, LowRankOfRankOneHasProportionalRows) {
  constexpr int64_t kRows = 6, kCols = 9;
  const std::vector<float> m = LowRank(kRows, kCols, 1, 3);
  ASSERT_EQ(m.size(), static_cast<size_t>(kRows * kCols));
  // Rank one: every 2 x 2 minor with the first row and column vanishes.
  for (int64_t i = 1; i < kRows; ++i) {
    for (int64_t j = 1; j < kCols; ++j) {
      const double minor = static_cast<double>(m[i * kCols + j]) * m[0] -
                           static_cast<double>(m[i * kCols]) * m[j];
      EXPECT_NEAR(minor, 0.0, 1e-5) << i << " " << j;
    }
  }
  // Rank two: some minor does not.
  const std::vector<float> two = LowRank(kRows, kCols, 2, 3);
  double largest = 0;
  for (int64_t i = 1; i < kRows; ++i) {
    for (int64_t j = 1; j < kCols; ++j) {
      largest = std::max(
          largest, std::fabs(static_cast<double>(two[i * kCols + j]) * two[0] -
                             static_cast<double>(two[i * kCols]) * two[j]));
    }
  }
  EXPECT_GT(largest, 1e-2);
}

}  // namespace
}  // namespace gradcomp::codecs::testing
