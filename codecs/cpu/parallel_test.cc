#include "codecs/cpu/parallel.h"

#include <atomic>
#include <cstddef>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace gradcomp::codecs {
namespace {

std::vector<std::pair<size_t, size_t>> Ranges(size_t n,
                                              const ParallelOptions& options) {
  std::vector<std::pair<size_t, size_t>> ranges(ParallelParts(n, options));
  std::mutex mu;
  ParallelFor(n, options, [&](size_t begin, size_t end, int part) {
    std::lock_guard<std::mutex> lock(mu);
    ranges[part] = {begin, end};
  });
  return ranges;
}

TEST(ParallelForTest, SmallInputRunsAsOnePart) {
  const auto ranges = Ranges(1000, {/*min_per_part=*/4096, /*align=*/1});
  ASSERT_EQ(ranges.size(), 1u);
  EXPECT_EQ(ranges[0], std::make_pair(size_t{0}, size_t{1000}));
}

TEST(ParallelForTest, EmptyInputCallsOnceWithEmptyRange) {
  int calls = 0;
  ParallelFor(0, {}, [&](size_t begin, size_t end, int) {
    ++calls;
    EXPECT_EQ(begin, end);
  });
  EXPECT_EQ(calls, 1);
}

TEST(ParallelForTest, PartsCoverInOrderAndAreAligned) {
  const ParallelOptions options{/*min_per_part=*/1000, /*align=*/96};
  const size_t n = 1'000'003;
  const auto ranges = Ranges(n, options);
  ASSERT_GE(ranges.size(), 1u);
  size_t next = 0;
  for (size_t p = 0; p < ranges.size(); ++p) {
    EXPECT_EQ(ranges[p].first, next);
    EXPECT_LE(ranges[p].first, ranges[p].second);
    if (p + 1 < ranges.size()) {
      EXPECT_EQ(ranges[p].second % 96, 0u);
    }
    next = ranges[p].second;
  }
  EXPECT_EQ(next, n);
}

TEST(ParallelForTest, EveryElementVisitedOnce) {
  const size_t n = 3'000'001;
  std::vector<std::atomic<int>> visits(n);
  ParallelFor(n, {/*min_per_part=*/1000, /*align=*/8},
              [&](size_t begin, size_t end, int) {
                for (size_t i = begin; i < end; ++i) visits[i]++;
              });
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(visits[i].load(), 1) << i;
}

TEST(ParallelForTest, ScopedThreadsSetsThePartCountAndRestoresIt) {
  const ParallelOptions options{/*min_per_part=*/1, /*align=*/1};
  const int machine = ParallelParts(1000, options);
  {
    ScopedParallelThreads threads(7);
    EXPECT_EQ(ParallelParts(1000, options), 7);
    EXPECT_EQ(Ranges(1000, options).size(), 7u);
    {
      ScopedParallelThreads one(1);
      EXPECT_EQ(ParallelParts(1000, options), 1);
    }
    EXPECT_EQ(ParallelParts(1000, options), 7);
  }
  EXPECT_EQ(ParallelParts(1000, options), machine);
}

// Parts run on threads kept between calls; a part that itself calls
// ParallelFor, more parts than cores, and calls from several threads at once
// must all finish (the waiting callers run queued parts themselves).
TEST(ParallelForTest, NestedAndConcurrentCallsAllFinish) {
  ScopedParallelThreads threads(5);
  const ParallelOptions options{/*min_per_part=*/1, /*align=*/1};
  std::vector<std::thread> callers;
  std::vector<std::atomic<int>> sums(4);
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&, c] {
      for (int round = 0; round < 50; ++round) {
        ParallelFor(10, options, [&](size_t begin, size_t end, int) {
          ParallelFor(end - begin, options, [&](size_t b, size_t e, int) {
            sums[c] += static_cast<int>(e - b);
          });
        });
      }
    });
  }
  for (std::thread& t : callers) t.join();
  for (int c = 0; c < 4; ++c) EXPECT_EQ(sums[c].load(), 50 * 10) << c;
}

}  // namespace
}  // namespace gradcomp::codecs
