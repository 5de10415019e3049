#include "codecs/nonfinite.h"

#include <cmath>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace gradcomp::codecs {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

TEST(CountNonfiniteTest, FiniteValuesCountNothing) {
  const std::vector<float> values = {0.0f,
                                     -0.0f,
                                     1.0f,
                                     std::numeric_limits<float>::max(),
                                     -std::numeric_limits<float>::max(),
                                     std::numeric_limits<float>::min(),
                                     std::numeric_limits<float>::denorm_min()};
  const Nonfinite n = CountNonfinite(values);
  EXPECT_EQ(n.count, 0u);
  EXPECT_EQ(n.first, 0u);
  EXPECT_EQ(CountNonfinite({}).count, 0u);
}

// Every kind of non-finite value, in the four-lane part and in the tail,
// at every position of a tensor whose size is not a multiple of four.
TEST(CountNonfiniteTest, CountsNaNAndBothInfinitiesAtAnyIndex) {
  for (const float bad : {kInf, -kInf, kNaN, -kNaN}) {
    for (size_t size : {1u, 4u, 7u, 13u}) {
      for (size_t at = 0; at < size; ++at) {
        std::vector<float> values(size, 1.5f);
        values[at] = bad;
        const Nonfinite n = CountNonfinite(values);
        EXPECT_EQ(n.count, 1u) << bad << " at " << at << " of " << size;
        EXPECT_EQ(n.first, at) << bad << " at " << at << " of " << size;
      }
    }
  }
}

// More values than one block of the lane counters (2^20): the blocks add up.
TEST(CountNonfiniteTest, CountsAcrossBlocksAndReportsTheFirst) {
  std::vector<float> values((size_t{1} << 21) + 3, 2.0f);
  size_t expected = 0;
  for (size_t i = 5; i < values.size(); i += 1000) {
    values[i] = (i / 1000) % 2 == 0 ? kNaN : -kInf;
    ++expected;
  }
  values.back() = kInf;
  const Nonfinite n = CountNonfinite(values);
  EXPECT_EQ(n.count, expected + 1);
  EXPECT_EQ(n.first, 5u);
}

}  // namespace
}  // namespace gradcomp::codecs
