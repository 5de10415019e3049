#include "service/collective/slice.h"

#include "gtest/gtest.h"

namespace gradcomp::service {
namespace {

TEST(SliceTest, SlicesAreContiguousInRankOrderAndCoverTheTensor) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{3}, size_t{7}, size_t{100},
                   size_t{25557032}}) {
    for (int w = 1; w <= 7; ++w) {
      size_t next = 0;
      for (int j = 0; j < w; ++j) {
        const Slice s = SliceOf(n, w, j);
        EXPECT_EQ(s.begin, next) << "n " << n << " w " << w << " j " << j;
        EXPECT_GE(s.size, n / w) << "n " << n << " w " << w << " j " << j;
        EXPECT_LE(s.size, n / w + 1) << "n " << n << " w " << w << " j " << j;
        next = s.begin + s.size;
      }
      EXPECT_EQ(next, n) << "n " << n << " w " << w;
    }
  }
}

TEST(SliceTest, SplitsLikeTheDocumentedFormula) {
  // [n*j/w, n*(j+1)/w): 10 over 4 ranks is 2, 3, 2, 3.
  EXPECT_EQ(SliceOf(10, 4, 0).size, 2u);
  EXPECT_EQ(SliceOf(10, 4, 1).begin, 2u);
  EXPECT_EQ(SliceOf(10, 4, 1).size, 3u);
  EXPECT_EQ(SliceOf(10, 4, 2).begin, 5u);
  EXPECT_EQ(SliceOf(10, 4, 3).begin, 7u);
  EXPECT_EQ(SliceOf(10, 4, 3).size, 3u);
}

}  // namespace
}  // namespace gradcomp::service
