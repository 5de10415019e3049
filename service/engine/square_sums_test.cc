#include "service/engine/square_sums.h"

#include <cmath>
#include <vector>

#include "codecs/testing/random_inputs.h"
#include "gtest/gtest.h"

namespace gradcomp::service {
namespace {

using codecs::testing::Normal;

// The sums in long double, one value after another.
SquareSums Reference(const std::vector<float>& a, const std::vector<float>& b,
                     size_t offset) {
  long double diff = 0, norm = 0;
  for (size_t i = offset; i < a.size(); ++i) {
    norm += static_cast<long double>(a[i]) * a[i];
    if (!b.empty()) {
      const long double e = static_cast<long double>(a[i]) - b[i];
      diff += e * e;
    }
  }
  return {static_cast<double>(diff), static_cast<double>(norm)};
}

// Every length around the 8-value stride (the tail), a large one, and a
// start that is not 8-byte aligned.
TEST(SumSquaresTest, MatchesALongDoubleSum) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{9},
                   size_t{15}, size_t{16}, size_t{17}, size_t{1'000'003}}) {
    for (size_t offset : {size_t{0}, size_t{1}}) {
      if (offset > n) continue;
      const std::vector<float> a = Normal(n, 1, 3.0f);
      const std::vector<float> b = Normal(n, 2, 0.5f);
      const absl::Span<const float> sa = absl::MakeConstSpan(a).subspan(offset);
      const absl::Span<const float> sb = absl::MakeConstSpan(b).subspan(offset);
      const SquareSums with_b = SumSquares(sa, sb);
      const SquareSums alone = SumSquares(sa, {});
      const SquareSums want = Reference(a, b, offset);
      EXPECT_NEAR(with_b.norm, want.norm, 1e-12 * want.norm) << n;
      EXPECT_NEAR(with_b.diff, want.diff, 1e-12 * want.diff) << n;
      EXPECT_EQ(alone.norm, with_b.norm) << n;
      EXPECT_EQ(alone.diff, 0.0) << n;
    }
  }
}

TEST(SumSquaresTest, AnExactDecodeHasNoError) {
  const std::vector<float> a = Normal(1001, 3, 1.0f);
  const SquareSums sums = SumSquares(a, a);
  EXPECT_EQ(sums.diff, 0.0);
  EXPECT_EQ(RelativeError(sums), 0.0);
}

TEST(RelativeErrorTest, IsTheRatioOfNormsAndNaNForAZeroInput) {
  EXPECT_DOUBLE_EQ(RelativeError({/*diff=*/1.0, /*norm=*/4.0}), 0.5);
  EXPECT_TRUE(std::isnan(RelativeError({0.0, 0.0})));
  const std::vector<float> zeros(12, 0.0f);
  EXPECT_TRUE(std::isnan(RelativeError(SumSquares(zeros, zeros))));
}

}  // namespace
}  // namespace gradcomp::service
