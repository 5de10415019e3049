#include "service/api/worker_pool.h"

#include <atomic>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace gradcomp::service {
namespace {

TEST(WorkerPoolTest, RunsEveryScheduledClosure) {
  std::atomic<int> sum{0};
  {
    WorkerPool pool(3);
    for (int i = 1; i <= 100; ++i) pool.Schedule([&sum, i] { sum += i; });
  }  // the destructor drains the queue
  EXPECT_EQ(sum.load(), 5050);
}

TEST(WorkerPoolTest, ClosuresRunConcurrently) {
  // Two closures that each wait for the other can only finish in parallel.
  WorkerPool pool(2);
  absl::Notification a_started, b_started, done_a, done_b;
  pool.Schedule([&] {
    a_started.Notify();
    b_started.WaitForNotification();
    done_a.Notify();
  });
  pool.Schedule([&] {
    b_started.Notify();
    a_started.WaitForNotification();
    done_b.Notify();
  });
  done_a.WaitForNotification();
  done_b.WaitForNotification();
}

}  // namespace
}  // namespace gradcomp::service
