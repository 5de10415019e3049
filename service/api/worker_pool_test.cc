#include "service/api/worker_pool.h"

#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "base/blocking_wait.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradcomp::service {
namespace {

using ::testing::ElementsAre;

WorkerPool::Limits Limits(int running, int threads, size_t queued) {
  WorkerPool::Limits limits;
  limits.running = running;
  limits.threads = threads;
  limits.queued = queued;
  return limits;
}

TEST(WorkerPoolTest, RunsEveryScheduledClosure) {
  std::atomic<int> sum{0};
  {
    WorkerPool pool(Limits(3, 3, 100));
    for (int i = 1; i <= 100; ++i) {
      ASSERT_TRUE(pool.TrySchedule([&sum, i] { sum += i; }));
    }
  }  // the destructor drains the queue
  EXPECT_EQ(sum.load(), 5050);
}

TEST(WorkerPoolTest, ClosuresRunConcurrently) {
  // Two closures that each wait for the other can only finish in parallel.
  WorkerPool pool(Limits(2, 2, 2));
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
  WorkerPool pool(Limits(1, 1, 2));  // destroyed (joined) before what it uses
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
  WorkerPool pool(Limits(3, 3, 10));
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

// Closures that each wait, in a ScopedBlockingWait as a batch's members
// do, until `release`; shared with them, so that it outlives the pool.
struct Waiters {
  std::atomic<int> arrived{0};
  absl::Notification all_arrived;
  absl::Notification release;

  // Whether all `n` ran at once, within a minute: bounded, so that a pool
  // that stalls fails the test instead of hanging it.
  bool AllArrived() {
    return all_arrived.WaitForNotificationWithTimeout(absl::Seconds(60));
  }
};

std::shared_ptr<Waiters> ScheduleWaiters(WorkerPool& pool, int n) {
  auto waiters = std::make_shared<Waiters>();
  for (int i = 0; i < n; ++i) {
    EXPECT_TRUE(pool.TrySchedule([waiters, n] {
      if (++waiters->arrived == n) waiters->all_arrived.Notify();
      ScopedBlockingWait waiting;
      waiters->release.WaitForNotification();
    }));
  }
  return waiters;
}

TEST(WorkerPoolTest, AClosureInABlockingWaitLetsAnotherThreadRunTheQueue) {
  // Three closures each wait until all three have arrived; one may run at
  // a time. Each wait lets another thread start, up to three, so all
  // three arrive.
  WorkerPool pool(Limits(1, 3, 10));
  std::shared_ptr<Waiters> waiters = ScheduleWaiters(pool, 3);
  const bool met = waiters->AllArrived();
  const int ran = waiters->arrived.load();
  waiters->release.Notify();
  EXPECT_TRUE(met) << ran << " of 3 closures ran while the others waited";
  EXPECT_EQ(pool.threads(), 3);
}

// Spins until `done` holds, for at most a minute: a pool that stalls
// fails the test instead of hanging it.
template <typename Done>
bool Eventually(Done done) {
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

// Holds a one-thread pool's thread until Release, so that what is
// scheduled meanwhile queues; records the order the queued closures ran.
class HeldPool {
 public:
  explicit HeldPool(size_t queued) : pool_(Limits(1, 1, queued)) {
    EXPECT_TRUE(pool_.TrySchedule([this] {
      running_.Notify();
      release_.WaitForNotification();
    }));
    running_.WaitForNotification();
  }
  ~HeldPool() { Release(); }

  WorkerPool& pool() { return pool_; }
  // A closure that records `name` when it runs.
  std::function<void()> Record(std::string name) {
    return [this, name] {
      absl::MutexLock lock(&mu_);
      ran_.push_back(name);
    };
  }
  void Release() {
    if (!release_.HasBeenNotified()) release_.Notify();
  }
  std::vector<std::string> Ran() {
    absl::MutexLock lock(&mu_);
    return ran_;
  }

 private:
  absl::Notification running_, release_;
  absl::Mutex mu_;
  std::vector<std::string> ran_ ABSL_GUARDED_BY(mu_);
  WorkerPool pool_;  // last: joined before what its closures use
};

TEST(WorkerPoolTest, QueuesAreServedInTurn) {
  // Four of a's closures wait when b's first arrives: b's runs second,
  // not fifth, and each queue keeps its own order.
  HeldPool held(100);
  WorkerPool& pool = held.pool();
  const WorkerPool::QueueId a = pool.NewQueue();
  const WorkerPool::QueueId b = pool.NewQueue();
  ASSERT_NE(a, b);
  for (int i = 1; i <= 4; ++i) {
    ASSERT_TRUE(pool.TrySchedule(held.Record(absl::StrCat("a", i)), a));
  }
  ASSERT_TRUE(pool.TrySchedule(held.Record("b1"), b));
  ASSERT_TRUE(pool.TrySchedule(held.Record("b2"), b));
  held.Release();
  ASSERT_TRUE(Eventually([&] { return held.Ran().size() == 6; }));
  EXPECT_THAT(held.Ran(), ElementsAre("a1", "b1", "a2", "b2", "a3", "a4"));
}

TEST(WorkerPoolTest, AFullPoolDisplacesTheLongestQueuesNewest) {
  // Room for three, all a's: b's first displaces a3 (told so), b's second
  // would make b as long as a and is refused, as is a's next.
  HeldPool held(3);
  WorkerPool& pool = held.pool();
  const WorkerPool::QueueId a = pool.NewQueue();
  const WorkerPool::QueueId b = pool.NewQueue();
  std::vector<std::string> displaced;
  for (int i = 1; i <= 3; ++i) {
    const std::string name = absl::StrCat("a", i);
    ASSERT_TRUE(pool.TrySchedule(held.Record(name), a,
                                 [&, name] { displaced.push_back(name); }));
  }
  EXPECT_TRUE(pool.TrySchedule(held.Record("b1"), b,
                               [&] { displaced.push_back("b1"); }));
  EXPECT_THAT(displaced, ElementsAre("a3"));
  EXPECT_FALSE(pool.TrySchedule(held.Record("b2"), b));
  EXPECT_FALSE(pool.TrySchedule(held.Record("a4"), a));
  held.Release();
  ASSERT_TRUE(Eventually([&] { return held.Ran().size() == 3; }));
  absl::SleepFor(absl::Milliseconds(20));  // nothing else runs
  EXPECT_THAT(held.Ran(), ElementsAre("a1", "b1", "a2"));
  EXPECT_THAT(displaced, ElementsAre("a3"));
}

TEST(WorkerPoolTest, WaitingClosuresStartNoThreadsPastTheLimit) {
  // Two threads at most: both closures wait, and the third stays queued
  // until one of them is done.
  WorkerPool pool(Limits(1, 2, 10));
  std::atomic<int> waiting{0};
  absl::Notification release;
  std::atomic<int> third{0};
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(pool.TrySchedule([&] {
      ScopedBlockingWait blocked;
      ++waiting;
      release.WaitForNotification();
    }));
  }
  const bool both_waiting = Eventually([&] { return waiting.load() == 2; });
  ASSERT_TRUE(pool.TrySchedule([&] { ++third; }));
  EXPECT_EQ(pool.threads(), 2);
  EXPECT_EQ(third.load(), 0);
  release.Notify();
  ASSERT_TRUE(both_waiting);
  EXPECT_TRUE(Eventually([&] { return third.load() == 1; }));
  EXPECT_EQ(pool.threads(), 2);
}

TEST(WorkerPoolTest, AClosureBackFromItsWaitHoldsTheQueueUntilItIsDone) {
  // One may run at a time. A waits, so B runs on a second thread; A's wait
  // ends while B runs, and C, queued then, waits for both to be done,
  // with no third thread started for it.
  WorkerPool pool(Limits(1, 3, 10));
  absl::Notification a_waiting, b_running, a_back, finish_a, finish_b;
  std::atomic<int> c_ran{0};
  ASSERT_TRUE(pool.TrySchedule([&] {
    {
      ScopedBlockingWait blocked;
      a_waiting.Notify();
      b_running.WaitForNotification();
    }
    a_back.Notify();
    finish_a.WaitForNotification();
  }));
  ASSERT_TRUE(a_waiting.WaitForNotificationWithTimeout(absl::Seconds(60)));
  ASSERT_TRUE(pool.TrySchedule([&] {
    b_running.Notify();
    finish_b.WaitForNotification();
  }));
  const bool b_ran =
      b_running.WaitForNotificationWithTimeout(absl::Seconds(60));
  const bool a_came_back =
      a_back.WaitForNotificationWithTimeout(absl::Seconds(60));
  ASSERT_TRUE(pool.TrySchedule([&] { ++c_ran; }));
  finish_b.Notify();
  // B's thread is idle now, but A runs: C stays queued.
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(c_ran.load(), 0);
  finish_a.Notify();
  EXPECT_TRUE(b_ran);
  EXPECT_TRUE(a_came_back);
  EXPECT_TRUE(Eventually([&] { return c_ran.load() == 1; }));
  EXPECT_EQ(pool.threads(), 2);
}

TEST(WorkerPoolTest, ReportsItsThreadsByStateAndItsQueue) {
  // One thread at most: a closure waits on it, and the next is queued.
  absl::Mutex mu;
  WorkerPool::Stats last;
  WorkerPool pool(Limits(1, 1, 10), [&](const WorkerPool::Stats& stats) {
    absl::MutexLock lock(&mu);
    last = stats;
  });
  auto seen = [&](int running, int waiting, int idle, size_t queued) {
    return Eventually([&] {
      absl::MutexLock lock(&mu);
      return last.running == running && last.waiting == waiting &&
             last.idle == idle && last.queued == queued;
    });
  };
  std::shared_ptr<Waiters> waiters = ScheduleWaiters(pool, 1);
  ASSERT_TRUE(waiters->AllArrived());
  EXPECT_TRUE(seen(0, 1, 0, 0));
  absl::Notification ran;
  ASSERT_TRUE(pool.TrySchedule([&] { ran.Notify(); }));
  EXPECT_TRUE(seen(0, 1, 0, 1));
  waiters->release.Notify();
  EXPECT_TRUE(ran.WaitForNotificationWithTimeout(absl::Seconds(60)));
  EXPECT_TRUE(seen(0, 0, 1, 0));
}

TEST(WorkerPoolTest, ThreadsBeyondTheRunningLimitEndWhenIdle) {
  // Three waits start three threads; once idle for the timeout, the two
  // beyond `running` end, and the pool still runs what comes next.
  WorkerPool::Limits limits = Limits(1, 3, 10);
  limits.idle_timeout = absl::Milliseconds(10);
  WorkerPool pool(limits);
  std::shared_ptr<Waiters> waiters = ScheduleWaiters(pool, 3);
  const bool met = waiters->AllArrived();
  const int threads = pool.threads();
  waiters->release.Notify();
  ASSERT_TRUE(met);
  EXPECT_EQ(threads, 3);
  EXPECT_TRUE(Eventually([&] { return pool.threads() == 1; }))
      << pool.threads() << " threads";
  absl::SleepFor(absl::Milliseconds(50));  // five timeouts: none below 1
  EXPECT_EQ(pool.threads(), 1);
  absl::Notification ran;
  ASSERT_TRUE(pool.TrySchedule([&] { ran.Notify(); }));
  EXPECT_TRUE(ran.WaitForNotificationWithTimeout(absl::Seconds(60)));
}

TEST(WorkerPoolTest, PoolsEndCleanlyWhileTheirThreadsEnd) {
  // Bursts of waits, then the pool is destroyed at some point of its
  // threads' ending for want of work: every thread is joined once (a
  // thread left joinable, or joined twice, ends the process; one that used
  // the freed pool fails under ASan).
  for (int round = 0; round < 50; ++round) {
    WorkerPool::Limits limits = Limits(1, 4, 10);
    limits.idle_timeout = absl::Microseconds(100 * (round % 10));
    WorkerPool pool(limits);
    std::atomic<int> arrived{0};
    for (int i = 0; i < 4; ++i) {
      ASSERT_TRUE(pool.TrySchedule([&] {
        ++arrived;
        ScopedBlockingWait waiting;
        while (arrived.load() < 4) absl::SleepFor(absl::Microseconds(50));
      }));
    }
    ASSERT_TRUE(Eventually([&] { return arrived.load() == 4; }));
    absl::SleepFor(absl::Microseconds(200 * (round % 7)));
  }
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
        WorkerPool pool(Limits(4, 4, 100));
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
