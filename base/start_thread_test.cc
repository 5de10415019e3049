#include "base/start_thread.h"

#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradcomp {
namespace {

using ::testing::HasSubstr;

TEST(StartThreadTest, RunsTheFunction) {
  std::atomic<int> ran{0};
  absl::StatusOr<std::thread> thread = StartThread([&] { ran = 1; }, "a test");
  ASSERT_TRUE(thread.ok()) << thread.status();
  thread->join();
  EXPECT_EQ(ran, 1);
}

// With the address space capped, thread stacks run out: every start after
// that is ResourceExhausted naming what it was for, and the process goes on
// (std::thread alone would throw, and uncaught that ends the process).
TEST(StartThreadTest, NoThreadLeftIsAnErrorNotAnAbort) {
  EXPECT_EXIT(
      {
        rlimit limit;
        getrlimit(RLIMIT_AS, &limit);
        limit.rlim_cur = 256ul << 20;  // far less than 100 default stacks
        if (setrlimit(RLIMIT_AS, &limit) != 0) _exit(3);
        absl::Notification stop;
        std::vector<std::thread> started;
        absl::Status refused;
        for (int i = 0; i < 1000 && refused.ok(); ++i) {
          absl::StatusOr<std::thread> t =
              StartThread([&stop] { stop.WaitForNotification(); }, "a test");
          if (t.ok()) {
            started.push_back(*std::move(t));
          } else {
            refused = t.status();
          }
        }
        stop.Notify();
        for (std::thread& t : started) t.join();
        const bool named =
            refused.code() == absl::StatusCode::kResourceExhausted &&
            refused.message().find("cannot start a thread for a test") !=
                absl::string_view::npos;
        _exit(named ? 0 : 4);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace gradcomp
