#include "codecs/cpu/bitpack.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
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

bool Bit(const std::string& packed, size_t i) {
  return (static_cast<uint8_t>(packed[i / 8]) >> (i % 8)) & 1;
}

TEST(PackSignsTest, SetsABitExactlyForNegativeValues) {
  // Lengths around a word, and one large enough to run on several threads.
  for (size_t n : {size_t{0}, size_t{1}, size_t{63}, size_t{64}, size_t{65},
                   size_t{1000}, size_t{3'000'001}}) {
    std::vector<float> x = Normal(n, static_cast<uint32_t>(n));
    if (n >= 4) {
      x[0] = 0.0f;
      x[1] = -0.0f;
      x[2] = std::nanf("");
      x[3] = -1e-30f;
    }
    std::string packed(SignBytes(n) + 8, '\x5a');  // a sentinel beyond
    const double l1 = PackSigns(x, packed.data());
    double expected_l1 = 0;
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(Bit(packed, i), x[i] < 0.0f) << "n " << n << " i " << i;
      if (!std::isnan(x[i])) expected_l1 += std::fabs(x[i]);
    }
    EXPECT_TRUE(SignPaddingIsZero(packed.data(), n)) << n;
    EXPECT_EQ(packed.substr(SignBytes(n)), std::string(8, '\x5a'));
    if (n >= 4) {
      EXPECT_TRUE(std::isnan(l1)) << "NaN must reach the sum";
      x[2] = 0.0f;
      const double again = PackSigns(x, packed.data());
      EXPECT_NEAR(again, expected_l1, 1e-6 * expected_l1) << n;
    } else {
      EXPECT_NEAR(l1, expected_l1, 1e-6 * expected_l1) << n;
    }
  }
}

TEST(AddSignsTest, AddsPosOrNegPerBit) {
  for (size_t n : {size_t{5}, size_t{129}, size_t{2'500'003}}) {
    const std::vector<float> x = Normal(n, 4);
    std::string packed(SignBytes(n), '\0');
    PackSigns(x, packed.data());
    std::vector<float> acc(n, 1.0f);
    AddSigns(packed.data(), 0.25f, -3.0f, absl::MakeSpan(acc));
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(acc[i], x[i] < 0.0f ? -2.0f : 1.25f) << "n " << n << " i " << i;
    }
  }
}

TEST(AddSignsTest, PeriodicValuesFollowTheLaneOfEachElement) {
  // Periods below, at and above a word; lengths that end mid-word and that
  // run on several threads.
  for (size_t period : {size_t{1}, size_t{3}, size_t{64}, size_t{100}}) {
    for (size_t n : {period * 7, period * 20'001}) {
      const std::vector<float> x = Normal(n, 6);
      std::string packed(SignBytes(n), '\0');
      PackSigns(x, packed.data());
      std::vector<float> pos(period + 64), neg(period + 64);
      for (size_t j = 0; j < pos.size(); ++j) {
        pos[j] = static_cast<float>(j % period) + 1;
        neg[j] = -static_cast<float>(j % period) - 0.5f;
      }
      std::vector<float> acc(n, 0.0f);
      AddSignsPeriodic(packed.data(), pos, neg, absl::MakeSpan(acc));
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(acc[i], x[i] < 0.0f ? neg[i % period] : pos[i % period])
            << "period " << period << " n " << n << " i " << i;
      }
    }
  }
}

TEST(SignPaddingIsZeroTest, DetectsAnyPaddingBit) {
  const size_t n = 70;  // 6 bits used in the second word, 58 padding
  std::string packed(SignBytes(n), '\0');
  EXPECT_TRUE(SignPaddingIsZero(packed.data(), n));
  packed[8] = 0x3f;  // bits 64..69: data
  EXPECT_TRUE(SignPaddingIsZero(packed.data(), n));
  for (int bit = 6; bit < 64; ++bit) {
    std::string bad = packed;
    bad[8 + bit / 8] = static_cast<char>(bad[8 + bit / 8] | (1 << (bit % 8)));
    EXPECT_FALSE(SignPaddingIsZero(bad.data(), n)) << bit;
  }
  // A whole number of words has no padding.
  EXPECT_TRUE(SignPaddingIsZero(std::string(8, '\xff').data(), 64));
}

}  // namespace
}  // namespace gradcomp::codecs
