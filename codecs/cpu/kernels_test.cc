#include "codecs/cpu/kernels.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace gradcomp::codecs {
namespace {

std::vector<float> Normal(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist;
  std::vector<float> x(n);
  for (float& v : x) v = dist(gen);
  return x;
}

double Reference(const std::vector<float>& x) {
  double sum = 0;
  for (float v : x) sum += static_cast<double>(v) * v;
  return sum;
}

TEST(SumOfSquaresTest, MatchesDoubleSumIncludingTail) {
  for (size_t n : {0u, 1u, 7u, 256u, 1000u, 100003u}) {
    const std::vector<float> x = Normal(n, 7);
    EXPECT_NEAR(SumOfSquares(x), Reference(x), 1e-6 * Reference(x) + 1e-12)
        << n;
  }
}

TEST(BucketSumOfSquaresTest, MatchesDoubleSumIncludingTail) {
  for (size_t n : {0u, 3u, 8u, 13u, 512u, 4099u}) {
    const std::vector<float> x = Normal(n, 11);
    EXPECT_NEAR(BucketSumOfSquares(x), Reference(x),
                1e-5 * Reference(x) + 1e-12)
        << n;
  }
}

// 2e19^2 = 4e38 overflows an fp32 lane sum although 2e19 is finite.
TEST(SumOfSquaresTest, FiniteForFiniteValuesWhoseSquaresOverflowFp32) {
  std::vector<float> x = Normal(1024, 3);  // four whole fp32-laned blocks
  x[300] = 2e19f;
  const double sum = SumOfSquares(x);
  ASSERT_TRUE(std::isfinite(sum));
  EXPECT_NEAR(sum, Reference(x), 1e-12 * Reference(x));
  x[301] = -3.4e38f;
  EXPECT_NEAR(SumOfSquares(x), Reference(x), 1e-12 * Reference(x));
}

TEST(SumOfSquaresTest, NotFiniteForNanOrInf) {
  std::vector<float> x = Normal(1024, 3);
  x[5] = INFINITY;
  EXPECT_EQ(SumOfSquares(x), INFINITY);
  x[5] = NAN;
  EXPECT_TRUE(std::isnan(SumOfSquares(x)));
}

TEST(BucketNormTest, IsTheSquareRootOfTheFp32SumWhereThatIsFinite) {
  for (size_t n : {0u, 3u, 8u, 13u, 512u, 4099u}) {
    const std::vector<float> x = Normal(n, 11);
    EXPECT_EQ(BucketNorm(x), std::sqrt(BucketSumOfSquares(x))) << n;
  }
}

TEST(BucketNormTest, FiniteForFiniteValuesWhoseSquaresOverflowFp32) {
  std::vector<float> x = Normal(512, 5);
  x[7] = -2e19f;
  ASSERT_EQ(BucketSumOfSquares(x), INFINITY);
  EXPECT_NEAR(BucketNorm(x), std::sqrt(Reference(x)), 1e-6 * 2e19);
  // A norm above FLT_MAX has no fp32 value; NaN and Inf stay what they are.
  const std::vector<float> huge(4, 3e38f);
  EXPECT_EQ(BucketNorm(huge), INFINITY);
  x[8] = NAN;
  EXPECT_TRUE(std::isnan(BucketNorm(x)));
  x[8] = -INFINITY;
  EXPECT_EQ(BucketNorm(x), INFINITY);
}

// Normal floats near 1e-25 whose fp32 squares underflow to 0 (or lose
// bits as subnormals): the sums are taken in double instead of being 0.
TEST(SumOfSquaresTest, TinyValuesWhoseSquaresUnderflowFp32AreSummedInDouble) {
  for (const float scale : {1e-20f, 1e-25f, 1e-30f}) {
    std::vector<float> x = Normal(1000, 13);
    for (float& v : x) v *= scale;
    const double want = Reference(x);
    ASSERT_GT(want, 0);
    EXPECT_NEAR(SumOfSquares(x), want, 1e-12 * want) << scale;
    const std::vector<float> bucket(x.begin(), x.begin() + 512);
    const double bucket_norm =
        std::sqrt(Reference(std::vector<float>(bucket.begin(), bucket.end())));
    EXPECT_NEAR(BucketNorm(bucket), bucket_norm, 1e-6 * bucket_norm) << scale;
  }
  // Zeros stay zeros, of either sign.
  EXPECT_EQ(BucketNorm(std::vector<float>(512, 0.0f)), 0.0f);
  EXPECT_EQ(BucketNorm(std::vector<float>(512, -0.0f)), 0.0f);
  EXPECT_EQ(SumOfSquares(std::vector<float>(1000, 0.0f)), 0.0);
}

TEST(WorkerStreamTest, SameContextSameStreamOtherRankOtherStream) {
  StepContext ctx;
  ctx.seed = 42;
  ctx.tensor_id = 7;
  ctx.step = 3;
  StepContext other_rank = ctx;
  other_rank.rank = 1;
  const PhiloxStream a = WorkerStream(ctx, 0);
  const PhiloxStream b = WorkerStream(ctx, 0);
  const PhiloxStream c = WorkerStream(other_rank, 0);
  int differing = 0;
  for (uint64_t i = 0; i < 64; ++i) {
    EXPECT_EQ(a.Bits(i), b.Bits(i));
    differing += a.Bits(i) != c.Bits(i);
  }
  EXPECT_GE(differing, 60);
}

}  // namespace
}  // namespace gradcomp::codecs
