#include "base/blocking_wait.h"

#include <thread>

#include "gtest/gtest.h"

namespace gradcomp {
namespace {

class CountingObserver : public BlockingWaitObserver {
 public:
  void WaitStarted() override { ++started; }
  void WaitEnded() override { ++ended; }
  int started = 0;
  int ended = 0;
};

TEST(BlockingWaitTest, TellsTheThreadsObserverOncePerOutermostWait) {
  CountingObserver counting;
  EXPECT_EQ(SetBlockingWaitObserver(&counting), nullptr);
  {
    ScopedBlockingWait outer;
    EXPECT_EQ(counting.started, 1);
    { ScopedBlockingWait inner; }
    EXPECT_EQ(counting.started, 1);
    EXPECT_EQ(counting.ended, 0);
  }
  EXPECT_EQ(counting.ended, 1);
  { ScopedBlockingWait again; }
  EXPECT_EQ(counting.started, 2);
  EXPECT_EQ(counting.ended, 2);
  EXPECT_EQ(SetBlockingWaitObserver(nullptr), &counting);
}

TEST(BlockingWaitTest, AnotherThreadsWaitsAreNotTold) {
  CountingObserver counting;
  SetBlockingWaitObserver(&counting);
  std::thread([] { ScopedBlockingWait elsewhere; }).join();
  EXPECT_EQ(counting.started, 0);
  SetBlockingWaitObserver(nullptr);
  { ScopedBlockingWait unobserved; }
  EXPECT_EQ(counting.started, 0);
}

}  // namespace
}  // namespace gradcomp
