#include "service/api/stall_watchdog.h"

#include <atomic>
#include <chrono>
#include <optional>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace gradcomp::service {
namespace {

TEST(StallWatchdogTest, CancelsAWaitOlderThanTheTimeoutOnce) {
  StallWatchdog watchdog(absl::Milliseconds(20));
  const StallWatchdog::Clock::time_point began_steady =
      StallWatchdog::Clock::now();
  std::atomic<int> cancels{0};
  absl::Notification cancelled;
  auto watched = watchdog.Watch([began_steady] { return began_steady; },
                                [&] {
                                  if (++cancels == 1) cancelled.Notify();
                                });
  ASSERT_TRUE(watched.ok()) << watched.status();
  ASSERT_TRUE(cancelled.WaitForNotificationWithTimeout(absl::Seconds(60)));
  EXPECT_GE(StallWatchdog::Clock::now() - began_steady,
            std::chrono::milliseconds(20));
  absl::SleepFor(absl::Milliseconds(100));  // many more looks
  EXPECT_EQ(cancels.load(), 1);
}

TEST(StallWatchdogTest, LeavesWaitsThatEndInTimeAndThoseNotWaiting) {
  // Each look finds a wait that just began, or none: twenty timeouts pass
  // without a cancel. The third, stuck, is cancelled meanwhile, so the
  // watchdog did look.
  StallWatchdog watchdog(absl::Milliseconds(10));
  std::atomic<int> cancels{0};
  auto fresh = watchdog.Watch([] { return StallWatchdog::Clock::now(); },
                              [&] { ++cancels; });
  auto idle = watchdog.Watch(
      [] { return std::optional<StallWatchdog::Clock::time_point>(); },
      [&] { ++cancels; });
  absl::Notification stuck_cancelled;
  const StallWatchdog::Clock::time_point began = StallWatchdog::Clock::now();
  auto stuck = watchdog.Watch([began] { return began; },
                              [&] { stuck_cancelled.Notify(); });
  ASSERT_TRUE(fresh.ok() && idle.ok() && stuck.ok());
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_TRUE(
      stuck_cancelled.WaitForNotificationWithTimeout(absl::Seconds(60)));
  EXPECT_EQ(cancels.load(), 0);
}

TEST(StallWatchdogTest, AWatchThatEndedIsNotCancelled) {
  StallWatchdog watchdog(absl::Milliseconds(10));
  const StallWatchdog::Clock::time_point began =
      StallWatchdog::Clock::now() - std::chrono::hours(1);
  std::atomic<int> cancels{0};
  {
    auto watched =
        watchdog.Watch([began] { return began; }, [&] { ++cancels; });
    ASSERT_TRUE(watched.ok());
    // Moved: the watch stays until the new owner goes.
    StallWatchdog::Watched moved = *std::move(watched);
  }
  const int at_end = cancels.load();
  EXPECT_LE(at_end, 1);
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(cancels.load(), at_end);
}

}  // namespace
}  // namespace gradcomp::service
