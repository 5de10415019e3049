// SumIntervalOf's promise, checked on the host: the CPU's sequential double
// chain of nonnegative terms lies in the interval around a sum of the same
// terms in another order (pairwise, reversed, in blocks), however the terms
// spread over the exponent range. Needs no GPU.
#include "codecs/cuda/segment_sums.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace gradcomp::codecs::cuda {
namespace {

double Sequential(const std::vector<double>& t, size_t begin, size_t end) {
  double sum = 0;
  for (size_t i = begin; i < end; ++i) sum += t[i];
  return sum;
}

double Pairwise(const std::vector<double>& t, size_t begin, size_t end) {
  if (end - begin <= 2) return Sequential(t, begin, end);
  const size_t mid = begin + (end - begin) / 2;
  return Pairwise(t, begin, mid) + Pairwise(t, mid, end);
}

double Reversed(const std::vector<double>& t) {
  double sum = 0;
  for (size_t i = t.size(); i > 0; --i) sum += t[i - 1];
  return sum;
}

// Runs of 64 summed, the runs' sums added in reverse (a GPU's shape).
double Blocked(const std::vector<double>& t) {
  std::vector<double> runs;
  for (size_t b = 0; b < t.size(); b += 64) {
    runs.push_back(Sequential(t, b, std::min(b + 64, t.size())));
  }
  return Reversed(runs);
}

TEST(SumIntervalTest, HoldsTheSequentialSumOfOtherOrders) {
  std::mt19937_64 gen(7);
  std::uniform_real_distribution<double> exponent(-60.0, 60.0);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  for (size_t m : {1, 2, 3, 64, 1000, 65537}) {
    for (int spread : {0, 1, 2}) {
      std::vector<double> t(m);
      for (double& x : t) {
        // fp32 terms: equal sizes, normal-ish, or over 2^+-60.
        const float f =
            spread == 0 ? 1.0f + 0x1p-23f * (gen() % 7)
            : spread == 1
                ? mantissa(gen)
                : std::ldexp(mantissa(gen), static_cast<int>(exponent(gen)));
        x = f;
      }
      const double cpu = Sequential(t, 0, m);
      for (double other : {Pairwise(t, 0, m), Reversed(t), Blocked(t)}) {
        const SumInterval in = SumIntervalOf(other, m);
        EXPECT_LE(in.lo, cpu) << "m=" << m << " spread=" << spread;
        EXPECT_GE(in.hi, cpu) << "m=" << m << " spread=" << spread;
        // Narrow enough to settle most roundings: 8 m u of the sum, plus
        // the rounding of lo and hi to doubles.
        EXPECT_LE(in.hi - in.lo, (8.0 * m + 4.0) * 0x1p-53 * other);
      }
    }
  }
}

TEST(SumIntervalTest, ZeroIsExact) {
  const SumInterval in = SumIntervalOf(0.0, 1000);
  EXPECT_EQ(in.lo, 0.0);
  EXPECT_EQ(in.hi, 0.0);
}

}  // namespace
}  // namespace gradcomp::codecs::cuda
