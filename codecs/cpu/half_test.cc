#include "codecs/cpu/half.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace gradcomp::codecs {
namespace {

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The value of a finite fp16 from the IEEE definition, in double.
double HalfValue(uint16_t h) {
  const int exponent = (h >> 10) & 0x1F;
  const int mantissa = h & 0x3FF;
  const double magnitude = exponent == 0
                               ? std::ldexp(mantissa, -24)
                               : std::ldexp(1024 + mantissa, exponent - 25);
  return (h & 0x8000) ? -magnitude : magnitude;
}

// Rounds x to fp16 by searching the table of all finite halves: the nearest
// value, ties to the even bit pattern; 65536 stands for infinity, which is
// where IEEE puts the overflow threshold.
uint16_t ReferenceToHalf(float x) {
  static const std::vector<double>* const table = [] {
    auto* t = new std::vector<double>();
    for (uint32_t h = 0; h <= 0x7C00; ++h) {
      t->push_back(h == 0x7C00 ? 65536.0 : HalfValue(static_cast<uint16_t>(h)));
    }
    return t;
  }();
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(x));
  if (a >= 65536.0) return sign | 0x7C00;
  const size_t hi =
      std::lower_bound(table->begin(), table->end(), a) - table->begin();
  if ((*table)[hi] == a) return sign | static_cast<uint16_t>(hi);
  const size_t lo = hi - 1;
  const double dlo = a - (*table)[lo], dhi = (*table)[hi] - a;
  const size_t pick = dlo < dhi ? lo : dhi < dlo ? hi : (lo % 2 == 0 ? lo : hi);
  return sign | static_cast<uint16_t>(pick);
}

// bf16 by the same rule: truncation or the next pattern, whichever is nearer.
uint16_t ReferenceToBf16(float x) {
  const uint32_t u = Bits(x);
  const uint16_t lo = static_cast<uint16_t>(u >> 16);
  const double below =
      static_cast<double>(FromBits(static_cast<uint32_t>(lo) << 16));
  const uint16_t hi = lo + 1;
  // One step further in magnitude; from the largest finite value that is
  // infinity, whose distance counts as if it were the next binade's value.
  const double above =
      ((hi & 0x7FFF) == 0x7F80)
          ? std::copysign(std::ldexp(1.0, 128), x)
          : static_cast<double>(FromBits(static_cast<uint32_t>(hi) << 16));
  const double dlo = std::fabs(x - below), dhi = std::fabs(above - x);
  if (dlo < dhi) return lo;
  if (dhi < dlo) return hi;
  return (lo % 2 == 0) ? lo : hi;
}

TEST(HalfTest, HalfToFloatMatchesTheDefinitionForAll65536Values) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = HalfBitsToFloat(static_cast<uint16_t>(h));
    const bool nan = (h & 0x7C00) == 0x7C00 && (h & 0x3FF) != 0;
    const bool inf = (h & 0x7FFF) == 0x7C00;
    if (nan) {
      ASSERT_TRUE(std::isnan(f)) << h;
    } else if (inf) {
      ASSERT_TRUE(std::isinf(f)) << h;
      ASSERT_EQ(std::signbit(f), (h & 0x8000) != 0) << h;
    } else {
      ASSERT_EQ(static_cast<double>(f), HalfValue(static_cast<uint16_t>(h)))
          << h;
      ASSERT_EQ(std::signbit(f), (h & 0x8000) != 0) << h;
    }
  }
}

TEST(HalfTest, All65536HalvesRoundTrip) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t back =
        FloatToHalfBits(HalfBitsToFloat(static_cast<uint16_t>(h)));
    const bool nan = (h & 0x7C00) == 0x7C00 && (h & 0x3FF) != 0;
    // A NaN comes back quiet (bit 9 set), with its sign and payload.
    ASSERT_EQ(back, nan ? (h | 0x200) : h) << h;
  }
}

TEST(HalfTest, RoundsToNearestEven) {
  EXPECT_EQ(FloatToHalfBits(1.0f + std::ldexp(1.0f, -11)),
            0x3C00);  // tie, even down
  EXPECT_EQ(FloatToHalfBits(1.0f + 3 * std::ldexp(1.0f, -11)),
            0x3C02);  // tie, even up
  EXPECT_EQ(FloatToHalfBits(std::nextafter(1.0f + std::ldexp(1.0f, -11), 2.0f)),
            0x3C01);
  EXPECT_EQ(FloatToHalfBits(std::ldexp(1.0f, -25)), 0x0000);  // subnormal tie
  EXPECT_EQ(FloatToHalfBits(3 * std::ldexp(1.0f, -25)),
            0x0002);  // subnormal tie
  EXPECT_EQ(FloatToHalfBits(-std::ldexp(1.0f, -26)),
            0x8000);  // underflow keeps sign
  EXPECT_EQ(FloatToHalfBits(65519.0f), 0x7BFF);
  EXPECT_EQ(FloatToHalfBits(65520.0f), 0x7C00);  // tie with 2^16: infinity
  EXPECT_EQ(FloatToHalfBits(-1e10f), 0xFC00);
  EXPECT_EQ(FloatToHalfBits(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(FloatToHalfBits(std::nanf("")) & 0x7E00, 0x7E00);
}

TEST(HalfTest, FloatToHalfMatchesReferenceAtEveryTieAndItsNeighbours) {
  for (uint32_t h = 0; h < 0x7C00; ++h) {
    const double mid =
        (HalfValue(static_cast<uint16_t>(h)) +
         (h + 1 == 0x7C00 ? 65536.0
                          : HalfValue(static_cast<uint16_t>(h + 1)))) /
        2;
    const float m = static_cast<float>(mid);  // exact: halves have 11 bits
    for (float x : {m, std::nextafter(m, 0.0f), std::nextafter(m, 1e30f)}) {
      ASSERT_EQ(FloatToHalfBits(x), ReferenceToHalf(x)) << x;
      ASSERT_EQ(FloatToHalfBits(-x), ReferenceToHalf(-x)) << -x;
    }
  }
}

TEST(HalfTest, FloatToHalfMatchesReferenceOnRandomFloats) {
  std::mt19937 gen(1234);
  for (int i = 0; i < 1000000; ++i) {
    // Exponents near fp16's range get most draws.
    const float x = FromBits(gen());
    const float near = std::ldexp(static_cast<float>(gen()) / 4294967296.0f,
                                  static_cast<int>(gen() % 48) - 30);
    for (float v : {x, near, -near}) {
      if (std::isnan(v)) continue;
      ASSERT_EQ(FloatToHalfBits(v), ReferenceToHalf(v)) << v;
    }
  }
}

TEST(Bf16Test, All65536Bf16RoundTripAndTiesGoToEven) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float f = Bf16BitsToFloat(static_cast<uint16_t>(b));
    const bool nan = (b & 0x7F80) == 0x7F80 && (b & 0x7F) != 0;
    ASSERT_EQ(Bits(f), b << 16);
    ASSERT_EQ(FloatToBf16Bits(f), nan ? (b | 0x40) : b) << b;
  }
  EXPECT_EQ(FloatToBf16Bits(FromBits(0x3F808000)), 0x3F80);
  EXPECT_EQ(FloatToBf16Bits(FromBits(0x3F818000)), 0x3F82);
  EXPECT_EQ(FloatToBf16Bits(FromBits(0x3F808001)), 0x3F81);
  EXPECT_EQ(FloatToBf16Bits(FromBits(0x7F7FFFFF)), 0x7F80);  // overflow to inf
  EXPECT_EQ(FloatToBf16Bits(FromBits(0x7F800001)) & 0x7FC0,
            0x7FC0);  // NaN stays NaN
}

TEST(Bf16Test, MatchesReferenceOnRandomFloats) {
  std::mt19937 gen(99);
  for (int i = 0; i < 2000000; ++i) {
    const float x = FromBits(gen());
    if (std::isnan(x) || std::isinf(x)) continue;
    ASSERT_EQ(FloatToBf16Bits(x), ReferenceToBf16(x)) << Bits(x);
  }
}

// Random bit patterns with NaNs, infinities, subnormals and ordinary values.
std::vector<float> MixedFloats(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    switch (i % 4) {
      case 0:
        v[i] = FromBits(gen());
        break;
      case 1:
        v[i] = std::ldexp(static_cast<float>(gen()) / 4294967296.0f - 0.5f,
                          static_cast<int>(gen() % 40) - 25);
        break;
      case 2:
        v[i] = static_cast<float>(gen() % 2001) - 1000.0f;
        break;
      default:
        v[i] = FromBits(gen() | 0x7F800000u);
        break;  // Inf or NaN
    }
  }
  return v;
}

// Compares the span functions with the scalar ones bit for bit, on the SIMD
// path and on the portable one, for a length with a tail, and one large
// enough to be split over threads, with unaligned 16-bit data.
class HalfSpanTest : public ::testing::TestWithParam<std::tuple<bool, size_t>> {
 protected:
  void SetUp() override { DisableHalfSimdForTesting(std::get<0>(GetParam())); }
  void TearDown() override { DisableHalfSimdForTesting(false); }
};

TEST_P(HalfSpanTest, SpanFunctionsEqualScalarOnes) {
  const size_t n = std::get<1>(GetParam());
  const std::vector<float> in = MixedFloats(n, 7);
  const float scale = 0.75f, alpha = -1.5f;
  std::vector<char> buf(4 * n + 1);
  char* out = buf.data() + 1;  // odd address: payload bodies have no alignment

  auto load16 = [&](size_t i) {
    uint16_t v;
    std::memcpy(&v, out + 2 * i, 2);
    return v;
  };
  auto same = [](float a, float b) {
    return Bits(a) == Bits(b) || (std::isnan(a) && std::isnan(b));
  };

  FloatToHalf(in, scale, out);
  for (size_t i = 0; i < n; ++i)
    ASSERT_EQ(load16(i), FloatToHalfBits(in[i] * scale)) << i;
  std::vector<float> back(n), acc(n, 1.0f);
  HalfToFloat(out, absl::MakeSpan(back));
  AddHalf(out, alpha, absl::MakeSpan(acc));
  for (size_t i = 0; i < n; ++i) {
    const float h = HalfBitsToFloat(load16(i));
    ASSERT_TRUE(same(back[i], h)) << i;
    ASSERT_TRUE(same(acc[i], 1.0f + alpha * h)) << i;
  }

  FloatToBf16(in, scale, out);
  for (size_t i = 0; i < n; ++i)
    ASSERT_EQ(load16(i), FloatToBf16Bits(in[i] * scale)) << i;
  std::fill(acc.begin(), acc.end(), 1.0f);
  Bf16ToFloat(out, absl::MakeSpan(back));
  AddBf16(out, alpha, absl::MakeSpan(acc));
  for (size_t i = 0; i < n; ++i) {
    const float b = Bf16BitsToFloat(load16(i));
    ASSERT_TRUE(same(back[i], b)) << i;
    ASSERT_TRUE(same(acc[i], 1.0f + alpha * b)) << i;
  }

  ScaleFloat(in, scale, out);
  std::fill(acc.begin(), acc.end(), 1.0f);
  AddFloat(out, alpha, absl::MakeSpan(acc));
  for (size_t i = 0; i < n; ++i) {
    float f;
    std::memcpy(&f, out + 4 * i, 4);
    ASSERT_TRUE(same(f, in[i] * scale)) << i;
    ASSERT_TRUE(same(acc[i], 1.0f + alpha * f)) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(
    SimdAndPortable, HalfSpanTest,
    ::testing::Combine(::testing::Bool(),
                       ::testing::Values(size_t{0}, size_t{1}, size_t{1037},
                                         (size_t{1} << 21) + 13)));

}  // namespace
}  // namespace gradcomp::codecs
