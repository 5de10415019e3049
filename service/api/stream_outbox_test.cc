#include "service/api/stream_outbox.h"

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace gradcomp::service {
namespace {

v1::ReduceStreamResponse Answer(int id, size_t bytes = 0) {
  v1::ReduceStreamResponse answer;
  answer.set_request_id(id);
  answer.set_error_message(std::string(bytes, 'x'));
  return answer;
}

// An outbox whose client reads nothing until `client_reads` is notified:
// its writer blocks in the first write until then.
absl::StatusOr<std::unique_ptr<StreamOutbox>> StalledOutbox(
    absl::Notification& client_reads, size_t max_unwritten_bytes) {
  return StreamOutbox::Start(
      [&client_reads](const v1::ReduceStreamResponse&) {
        client_reads.WaitForNotification();
        return true;
      },
      max_unwritten_bytes);
}

TEST(StreamOutboxTest, WritesEveryAnswerInOrderBeforeClosing) {
  std::vector<int> written;
  auto started = StreamOutbox::Start(
      [&](const v1::ReduceStreamResponse& a) {
        written.push_back(a.request_id());
        return true;
      },
      1 << 20);
  ASSERT_TRUE(started.ok()) << started.status();
  StreamOutbox* outbox = started->get();
  for (int i = 0; i < 100; ++i) outbox->Push(Answer(i));
  EXPECT_TRUE(outbox->Close());
  ASSERT_EQ(written.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(written[i], i);
}

// The client does not read: its write blocks. Pushing never waits for it;
// the reader's WaitForRoom does, once the unwritten answers pass the bound,
// and goes on when the client takes them.
TEST(StreamOutboxTest, PushNeverWaitsForTheClientAndTheReaderDoes) {
  absl::Notification client_reads;
  auto started = StalledOutbox(client_reads, /*max_unwritten_bytes=*/1000);
  ASSERT_TRUE(started.ok()) << started.status();
  StreamOutbox* outbox = started->get();
  for (int i = 0; i < 10; ++i) outbox->Push(Answer(i, 500));  // returns
  absl::Notification room;
  std::thread reader([&] {
    EXPECT_TRUE(outbox->WaitForRoom());
    room.Notify();
  });
  EXPECT_FALSE(room.HasBeenNotified());
  client_reads.Notify();
  reader.join();
  EXPECT_TRUE(room.HasBeenNotified());
  EXPECT_TRUE(outbox->Close());
}

// What the stall watchdog reads: the start of a write the client does not
// take, and nothing once it has.
TEST(StreamOutboxTest, WritingSinceNamesAWriteInProgressOnly) {
  absl::Notification client_reads;
  auto started = StalledOutbox(client_reads, /*max_unwritten_bytes=*/1000);
  ASSERT_TRUE(started.ok()) << started.status();
  StreamOutbox* outbox = started->get();
  EXPECT_EQ(outbox->WritingSince(), std::nullopt);
  const auto before = std::chrono::steady_clock::now();
  outbox->Push(Answer(1));
  std::optional<std::chrono::steady_clock::time_point> since;
  for (int i = 0; i < 60000 && !since.has_value(); ++i) {
    absl::SleepFor(absl::Milliseconds(1));
    since = outbox->WritingSince();
  }
  ASSERT_TRUE(since.has_value());
  EXPECT_GE(*since, before);
  EXPECT_LE(*since, std::chrono::steady_clock::now());
  client_reads.Notify();
  EXPECT_TRUE(outbox->Close());
  EXPECT_EQ(outbox->WritingSince(), std::nullopt);
}

// An answer's hold (its reservation of the memory budget) lives until the
// client has taken the answer, not until it was pushed.
TEST(StreamOutboxTest, AnAnswersHoldIsKeptUntilItIsWritten) {
  absl::Notification client_reads;
  auto started = StalledOutbox(client_reads, 1 << 20);
  ASSERT_TRUE(started.ok()) << started.status();
  StreamOutbox* outbox = started->get();
  auto hold = std::make_shared<int>(7);
  const std::weak_ptr<int> watched = hold;
  outbox->Push(Answer(1), std::move(hold));
  absl::SleepFor(absl::Milliseconds(50));  // the writer is in its write
  EXPECT_FALSE(watched.expired());
  client_reads.Notify();
  EXPECT_TRUE(outbox->Close());
  EXPECT_TRUE(watched.expired());
}

// A broken stream: the rest is dropped, the reader is told to stop, and
// Close says the answers did not all arrive.
TEST(StreamOutboxTest, ABrokenStreamDropsTheRestAndStopsTheReader) {
  int writes = 0;
  auto started = StreamOutbox::Start(
      [&](const v1::ReduceStreamResponse&) {
        ++writes;
        return false;
      },
      /*max_unwritten_bytes=*/0);
  ASSERT_TRUE(started.ok()) << started.status();
  StreamOutbox* outbox = started->get();
  outbox->Push(Answer(0, 100));
  EXPECT_FALSE(outbox->WaitForRoom());
  outbox->Push(Answer(1, 100));
  EXPECT_FALSE(outbox->Close());
  EXPECT_EQ(writes, 1);
}

}  // namespace
}  // namespace gradcomp::service
