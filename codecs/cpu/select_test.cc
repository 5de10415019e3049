#include "codecs/cpu/select.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
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

// The k indices of largest |x|, ties to the lower index, ascending.
std::vector<uint32_t> ExactTopK(const std::vector<float>& x, size_t k) {
  std::vector<uint32_t> order(x.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    return std::fabs(x[a]) > std::fabs(x[b]);
  });
  order.resize(k);
  std::sort(order.begin(), order.end());
  return order;
}

// Every selected magnitude is at least every unselected one.
void ExpectLargestSelected(const std::vector<float>& x,
                           const std::vector<uint32_t>& indices) {
  std::vector<bool> chosen(x.size());
  float min_chosen = INFINITY;
  for (uint32_t i : indices) {
    chosen[i] = true;
    min_chosen = std::min(min_chosen, std::fabs(x[i]));
  }
  float max_other = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (!chosen[i]) max_other = std::max(max_other, std::fabs(x[i]));
  }
  if (!indices.empty()) {
    EXPECT_GE(min_chosen, max_other);
  }
}

void ExpectStrictlyAscending(const std::vector<uint32_t>& indices) {
  for (size_t j = 1; j < indices.size(); ++j) {
    ASSERT_LT(indices[j - 1], indices[j]) << j;
  }
}

const PhiloxStream kRng(1, 2, 3, 0);

TEST(SelectTopKTest, FullSampleIsExactTopK) {
  const std::vector<float> x = Normal(100000, 1);
  for (size_t k : {1u, 10u, 100u, 5000u}) {
    const TopKSelection sel = SelectTopK(x, k, 1.0, kRng);
    EXPECT_EQ(sel.indices, ExactTopK(x, k)) << k;
    EXPECT_EQ(sel.sample_size, x.size());
    EXPECT_EQ(sel.passes, 1);
  }
}

TEST(SelectTopKTest, ExactTiesGoToLowerIndex) {
  const std::vector<float> x = {1, -3, 2, 3, 3, -1, 0.5};
  const TopKSelection sel = SelectTopK(x, 2, 1.0, kRng);
  EXPECT_EQ(sel.indices, (std::vector<uint32_t>{1, 3}));
}

TEST(SelectTopKTest, SampledSelectionIsCloseToKAndTheLargest) {
  const std::vector<float> x = Normal(2'000'000, 2);
  for (size_t k : {2000u, 20000u}) {
    const TopKSelection sel = SelectTopK(x, k, 0.01, kRng);
    EXPECT_LE(sel.indices.size(), k);
    EXPECT_GE(sel.indices.size(), 0.8 * k);
    EXPECT_EQ(sel.sample_size, 20000u);
    ExpectStrictlyAscending(sel.indices);
    ExpectLargestSelected(x, sel.indices);
  }
}

TEST(SelectTopKTest, LargeSampleSplitAcrossThreads) {
  // 200k sampled values: enough for the sample to be drawn in parallel.
  const std::vector<float> x = Normal(2'000'000, 5);
  const TopKSelection sel = SelectTopK(x, 20000, 0.1, kRng);
  EXPECT_EQ(sel.sample_size, 200000u);
  EXPECT_LE(sel.indices.size(), 20000u);
  EXPECT_GE(sel.indices.size(), 16000u);
  ExpectStrictlyAscending(sel.indices);
  ExpectLargestSelected(x, sel.indices);
  // The same stream draws the same sample and selection.
  EXPECT_EQ(SelectTopK(x, 20000, 0.1, kRng).indices, sel.indices);
}

TEST(SelectTopKTest, SampleHasAtLeastTwoOverRatioValues) {
  const std::vector<float> x = Normal(1'000'000, 3);
  const TopKSelection sel = SelectTopK(x, 100, 0.001, kRng);
  EXPECT_EQ(sel.sample_size, 20000u);  // ceil(2 / (100 / 1e6))
}

TEST(SelectTopKTest, TinySampleRetriesWithLowerThresholdUntilEnough) {
  // Sampling only ceil(2n/k) values makes the threshold the 2nd largest of a
  // few: often too high, which the lowering passes must repair.
  const std::vector<float> x = Normal(200000, 4);
  const size_t k = 1000;
  int retried = 0;
  for (int step = 0; step < 40; ++step) {
    const TopKSelection sel =
        SelectTopK(x, k, 1e-9, PhiloxStream(9, 9, step, 0));
    EXPECT_EQ(sel.sample_size, 400u);
    EXPECT_LE(sel.indices.size(), k);
    EXPECT_GE(sel.indices.size(), 0.8 * k);
    ExpectLargestSelected(x, sel.indices);
    retried += sel.passes > 1;
  }
  EXPECT_GT(retried, 0);
}

TEST(SelectTopKTest, ZerosAreNeverSelected) {
  std::vector<float> x(1000, 0.0f);
  x[10] = -2;
  x[500] = 1;
  EXPECT_EQ(SelectTopK(x, 100, 1.0, kRng).indices,
            (std::vector<uint32_t>{10, 500}));
  EXPECT_EQ(SelectTopK(x, 100, 0.01, kRng).indices,
            (std::vector<uint32_t>{10, 500}));
  EXPECT_TRUE(SelectTopK(std::vector<float>(1000, 0.0f), 10, 0.01, kRng)
                  .indices.empty());
}

TEST(SelectTopKTest, KOfAllSelectsEveryNonzero) {
  const std::vector<float> x = {0, 1, -1, 0, 3};
  EXPECT_EQ(SelectTopK(x, 5, 0.01, kRng).indices,
            (std::vector<uint32_t>{1, 2, 4}));
  EXPECT_EQ(SelectTopK(x, 50, 0.01, kRng).indices,
            (std::vector<uint32_t>{1, 2, 4}));
}

// The filter's two paths (AVX2 where the CPU has it, and SSE2) must find
// the same indices: each test below runs on both.
class SelectPathTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { DisableSelectSimdForTesting(GetParam()); }
  void TearDown() override { DisableSelectSimdForTesting(false); }
};

TEST_P(SelectPathTest, SimdIsUsedWhereTheCpuHasItUnlessDisabled) {
#if defined(__x86_64__)
  EXPECT_EQ(SelectSimdActive(),
            !GetParam() && __builtin_cpu_supports("avx2") != 0);
#else
  EXPECT_FALSE(SelectSimdActive());
#endif
}

// The filter tests sixteen keys at a time and then the tail one by one:
// every lane of a block, a block of hits only, and the tail must be found,
// down to the smallest subnormal and up to NaN.
TEST_P(SelectPathTest, EveryLaneOfABlockAndTheTailAreFound) {
  std::vector<float> x(16 * 4 + 7, 0.0f);
  for (size_t lane = 0; lane < 16; ++lane) x[16 + lane] = -1.0f;  // all hits
  for (size_t lane = 0; lane < 16; lane += 3) x[32 + lane] = 2.0f;
  x[48] = std::numeric_limits<float>::denorm_min();
  x[63] = NAN;
  x[64] = -INFINITY;
  x[70] = 0.5f;
  std::vector<uint32_t> nonzero;
  for (uint32_t i = 0; i < x.size(); ++i) {
    if (x[i] != 0.0f) nonzero.push_back(i);
  }
  for (double fraction : {1.0, 0.01}) {
    EXPECT_EQ(SelectTopK(x, x.size(), fraction, kRng).indices, nonzero)
        << fraction;
  }
}

// Large enough for the filter to run in parts on threads, at densities
// from one hit in a thousand blocks to hits in most of them.
TEST_P(SelectPathTest, ExactTopKAtEveryDensity) {
  const std::vector<float> x = Normal(3'000'017, 9);
  for (size_t k : {100u, 30'000u, 600'000u}) {
    const TopKSelection sel = SelectTopK(x, k, 1.0, kRng);
    EXPECT_EQ(sel.indices, ExactTopK(x, k)) << k;
  }
}

INSTANTIATE_TEST_SUITE_P(SimdAndSse2, SelectPathTest, ::testing::Bool());

TEST(SelectTopKTest, NonFiniteValuesComeFirst) {
  std::vector<float> x = Normal(100000, 6);
  x[123] = NAN;
  x[77777] = -INFINITY;
  for (double fraction : {1.0, 0.01}) {
    const std::vector<uint32_t> idx = SelectTopK(x, 2, fraction, kRng).indices;
    EXPECT_EQ(idx, (std::vector<uint32_t>{123, 77777})) << fraction;
  }
  // A tensor of NaNs: no comparator trouble, k of them go.
  const std::vector<float> nans(50000, NAN);
  EXPECT_EQ(SelectTopK(nans, 100, 0.01, kRng).indices.size(), 100u);
  EXPECT_EQ(SelectTopK(nans, 100, 1.0, kRng).indices.size(), 100u);
}

TEST(SelectTopKTest, EmptyInputOrZeroK) {
  EXPECT_TRUE(SelectTopK({}, 10, 0.01, kRng).indices.empty());
  const std::vector<float> x = {1, 2, 3};
  EXPECT_TRUE(SelectTopK(x, 0, 0.01, kRng).indices.empty());
}

}  // namespace
}  // namespace gradcomp::codecs
