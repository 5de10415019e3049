#include "codecs/random.h"

#include <Random123/philox.h>

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace gradcomp::codecs {
namespace {

TEST(TensorIdTest, IsFnv1a64) {
  // Published FNV-1a 64-bit test values.
  EXPECT_EQ(TensorId(""), 0xcbf29ce484222325ULL);
  EXPECT_EQ(TensorId("a"), 0xaf63dc4c8601ec8cULL);
  EXPECT_EQ(TensorId("foobar"), 0x85944171f73967e8ULL);
}

TEST(PhiloxStreamTest, LibraryMatchesRandom123KnownAnswer) {
  // Random123's kat_vectors: philox4x64-10 of a zero counter and key.
  r123::Philox4x64 philox;
  const r123::Philox4x64::ctr_type r =
      philox(r123::Philox4x64::ctr_type{{0, 0, 0, 0}},
             r123::Philox4x64::key_type{{0, 0}});
  EXPECT_EQ(r.v[0], 0x16554d9eca36314cULL);
  EXPECT_EQ(r.v[1], 0xdb20fe9d672d0fdcULL);
  EXPECT_EQ(r.v[2], 0xd7e772cee186176bULL);
  EXPECT_EQ(r.v[3], 0x7e68b68aec7ba23bULL);
}

TEST(PhiloxStreamTest, CounterAndKeyLayoutIsTheDocumentedOne) {
  const PhiloxStream rng(/*seed=*/11, /*tensor_id=*/22, /*step=*/33,
                         /*round=*/4);
  r123::Philox4x64 philox;
  const r123::Philox4x64::ctr_type expected =
      philox(r123::Philox4x64::ctr_type{{5, 33, 4, 22}},
             r123::Philox4x64::key_type{{11, 0x67726164636f6d70ULL}});
  uint64_t words[4];
  rng.Block(5, words);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(words[i], expected.v[i]) << i;
  // Word j of block 5 is Bits(40 + j), low half first.
  EXPECT_EQ(rng.Bits(40), static_cast<uint32_t>(expected.v[0]));
  EXPECT_EQ(rng.Bits(41), static_cast<uint32_t>(expected.v[0] >> 32));
  EXPECT_EQ(rng.Bits(47), static_cast<uint32_t>(expected.v[3] >> 32));
  EXPECT_EQ(rng.Uniform(42),
            static_cast<float>(static_cast<uint32_t>(expected.v[1]) >> 8) /
                16777216.0f);
}

TEST(PhiloxStreamTest, FillUniformEqualsUniformAtEveryOffset) {
  const PhiloxStream rng(1, TensorId("fc1.weight"), 7, 0);
  for (uint64_t first : {0, 1, 5, 8, 13}) {
    for (size_t len : {0, 1, 7, 8, 9, 31}) {
      std::vector<float> out(len, -1.0f);
      rng.FillUniform(first, absl::MakeSpan(out));
      for (size_t j = 0; j < len; ++j) {
        ASSERT_EQ(out[j], rng.Uniform(first + j)) << first << " " << j;
      }
    }
  }
}

TEST(PhiloxStreamTest, EveryKeyPartChangesTheStream) {
  const PhiloxStream base(1, 2, 3, 0);
  const PhiloxStream others[] = {
      PhiloxStream(9, 2, 3, 0), PhiloxStream(1, 9, 3, 0),
      PhiloxStream(1, 2, 9, 0), PhiloxStream(1, 2, 3, 1)};
  for (const PhiloxStream& other : others) {
    int same = 0;
    for (uint64_t i = 0; i < 64; ++i) same += base.Bits(i) == other.Bits(i);
    EXPECT_LT(same, 2);
  }
  const PhiloxStream again(1, 2, 3, 0);
  for (uint64_t i = 0; i < 64; ++i) EXPECT_EQ(base.Bits(i), again.Bits(i));
}

TEST(PhiloxStreamTest, UniformIsUniform) {
  // n = 2^20 draws: mean 1/2 and variance 1/12; the tolerances are 5 standard
  // errors, so a correct generator fails with probability < 1e-6.
  const size_t n = size_t{1} << 20;
  std::vector<float> u(n);
  PhiloxStream(42, 0, 0, 0).FillUniform(0, absl::MakeSpan(u));
  double sum = 0, sum_sq = 0;
  std::vector<int> bins(16, 0);
  for (float x : u) {
    ASSERT_GE(x, 0.0f);
    ASSERT_LT(x, 1.0f);
    sum += x;
    sum_sq += static_cast<double>(x) * x;
    ++bins[static_cast<int>(x * 16)];
  }
  const double mean = sum / n;
  const double var = sum_sq / n - mean * mean;
  EXPECT_NEAR(mean, 0.5, 5 * std::sqrt(1.0 / 12 / n));
  // Var of the sample variance of U(0,1): (1/80 - 1/144) / n.
  EXPECT_NEAR(var, 1.0 / 12, 5 * std::sqrt((1.0 / 80 - 1.0 / 144) / n));
  // Chi-square with 15 degrees of freedom: 40 is beyond the 0.9995 quantile.
  double chi2 = 0;
  const double expected = n / 16.0;
  for (int b : bins) chi2 += (b - expected) * (b - expected) / expected;
  EXPECT_LT(chi2, 40.0);
}

}  // namespace
}  // namespace gradcomp::codecs
