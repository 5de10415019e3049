#include "service/api/worker_pool.h"

#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <fstream>

#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace gradcomp::service {
namespace {

TEST(WorkerPoolTest, RunsEveryScheduledClosure) {
  std::atomic<int> sum{0};
  {
    WorkerPool pool(3, 100);
    for (int i = 1; i <= 100; ++i) {
      ASSERT_TRUE(pool.TrySchedule([&sum, i] { sum += i; }));
    }
  }  // the destructor drains the queue
  EXPECT_EQ(sum.load(), 5050);
}

TEST(WorkerPoolTest, ClosuresRunConcurrently) {
  // Two closures that each wait for the other can only finish in parallel.
  WorkerPool pool(2, 2);
  absl::Notification a_started, b_started, done_a, done_b;
  ASSERT_TRUE(pool.TrySchedule([&] {
    a_started.Notify();
    b_started.WaitForNotification();
    done_a.Notify();
  }));
  ASSERT_TRUE(pool.TrySchedule([&] {
    b_started.Notify();
    a_started.WaitForNotification();
    done_b.Notify();
  }));
  done_a.WaitForNotification();
  done_b.WaitForNotification();
}

TEST(WorkerPoolTest, FullQueueRefusesAndTakesMoreOnceItDrains) {
  // One thread held busy, so the queue fills: two wait, the third is
  // refused and never runs.
  absl::Notification running, release, drained;
  std::atomic<int> ran{0};
  WorkerPool pool(1, 2);  // destroyed (joined) before what it uses
  ASSERT_TRUE(pool.TrySchedule([&] {
    running.Notify();
    release.WaitForNotification();
  }));
  running.WaitForNotification();
  EXPECT_TRUE(pool.TrySchedule([&] { ++ran; }));
  EXPECT_TRUE(pool.TrySchedule([&] { ++ran; }));
  EXPECT_FALSE(pool.TrySchedule([&] { ran += 100; }));
  release.Notify();
  // The queue drains: scheduling succeeds again (retried until a slot is
  // free, with no timing assumed).
  while (!pool.TrySchedule([&] { drained.Notify(); })) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  drained.WaitForNotification();
  EXPECT_EQ(ran.load(), 2);
}

TEST(WorkerPoolTest, StartsThreadsOnDemandUpToTheMaximum) {
  // Closures held running: each one that finds no idle thread starts one,
  // until the maximum; the fourth waits in the queue for a thread.
  WorkerPool pool(3, 10);
  EXPECT_EQ(pool.threads(), 0);
  absl::Notification release;
  absl::BlockingCounter started(3);
  std::atomic<int> ran{0};
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(pool.TrySchedule([&] {
      if (ran.fetch_add(1) < 3) {
        started.DecrementCount();
        release.WaitForNotification();
      }
    }));
    if (i == 0) {
      EXPECT_EQ(pool.threads(), 1);
    }
  }
  started.Wait();
  EXPECT_EQ(pool.threads(), 3);
  EXPECT_EQ(ran.load(), 3);  // the fourth has no thread until one is free
  release.Notify();
  while (ran.load() < 4) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_EQ(pool.threads(), 3);
}

// No thread can be started (address space capped at what the process
// holds, less than a thread's stack): the closure is refused, and the
// process goes on, instead of std::thread's exception ending it.
TEST(WorkerPoolTest, NoThreadToStartRefusesTheClosure) {
  // A fresh process: a forked one would reuse the stacks glibc keeps from
  // the threads of earlier tests, without asking for memory.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        WorkerPool pool(4, 100);
        long pages = 0;
        std::ifstream("/proc/self/statm") >> pages;
        rlimit limit;
        getrlimit(RLIMIT_AS, &limit);
        limit.rlim_cur =
            static_cast<rlim_t>(pages) * sysconf(_SC_PAGESIZE) + (1 << 20);
        if (setrlimit(RLIMIT_AS, &limit) != 0) _exit(3);
        const bool scheduled = pool.TrySchedule([] {});
        _exit(scheduled ? 4 : 0);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace gradcomp::service
