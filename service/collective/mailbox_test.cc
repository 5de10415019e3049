#include "service/collective/mailbox.h"

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/metrics/metrics_testing.h"
#include "service/metrics/peer_metrics.h"

namespace gradcomp::service {
namespace {

using ::testing::HasSubstr;

std::string Name(int rank) { return absl::StrCat("rank ", rank, " (test)"); }

MessageKey Key(int64_t step, std::string tensor = "w") {
  return MessageKey{"job", std::move(tensor), step, 0, Phase::kGather};
}

TEST(MailboxTest, MessagesThatCameFirstWaitForTheLocalCall) {
  Mailbox mailbox(3, {}, nullptr);
  mailbox.OnMessage(2, Key(5), "from2");
  mailbox.OnMessage(1, Key(5), "from1");
  mailbox.OnMessage(1, Key(6), "later step");
  const uint64_t slot = mailbox.SlotBytes(Key(5));
  EXPECT_EQ(mailbox.unclaimed_bytes(), 2 * slot + 5u + 5u + 10u);
  auto got = mailbox.Collect(Key(5), {1, 2}, absl::InfiniteFuture(), Name);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_THAT(*got, ::testing::ElementsAre("", "from1", "from2"));
  EXPECT_EQ(mailbox.unclaimed_bytes(), slot + 10u);
}

TEST(MailboxTest, CollectWaitsForMessagesThatComeLater) {
  PeerMetrics metrics(0, 2);
  Mailbox mailbox(2, {}, &metrics);
  std::thread sender([&] {
    // Once the Collect below waits for it.
    while (MetricValue(*metrics.collectable(), "gradcomp_peer_waiting",
                       {{"peer", "1"}}) != 1) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    mailbox.OnMessage(1, Key(0), "late");
  });
  auto got = mailbox.Collect(Key(0), {1}, absl::InfiniteFuture(), Name);
  sender.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)[1], "late");
}

TEST(MailboxTest, ADamagedMessageFailsItsCollectBeforeOrDuringTheCall) {
  Mailbox mailbox(3, {}, nullptr);
  const absl::Status damaged =
      absl::DataLossError("the message from rank 2 failed its checksum");
  mailbox.OnMessage(1, Key(4), "fine");
  mailbox.OnCorruptMessage(2, Key(4), damaged);
  auto early = mailbox.Collect(Key(4), {1, 2}, absl::InfiniteFuture(), Name);
  EXPECT_EQ(early.status(), damaged);

  std::thread sender([&] { mailbox.OnCorruptMessage(1, Key(5), damaged); });
  auto late = mailbox.Collect(Key(5), {1, 2}, absl::InfiniteFuture(), Name);
  sender.join();
  EXPECT_EQ(late.status(), damaged);
  EXPECT_EQ(mailbox.unclaimed_bytes(), 0u);
}

TEST(MailboxTest, CloseEndsAWaitingCollectAndRefusesLaterOnes) {
  PeerMetrics metrics(0, 2);
  Mailbox mailbox(2, {}, &metrics);
  const absl::Status stopping =
      absl::UnavailableError("rank 0 is shutting down (SIGTERM)");
  std::thread closer([&] {
    // Once the Collect below waits for rank 1.
    while (MetricValue(*metrics.collectable(), "gradcomp_peer_waiting",
                       {{"peer", "1"}}) != 1) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    mailbox.Close(stopping);
  });
  auto waiting = mailbox.Collect(Key(0), {1}, absl::InfiniteFuture(), Name);
  closer.join();
  EXPECT_EQ(waiting.status(), stopping);
  EXPECT_EQ(MetricValue(*metrics.collectable(), "gradcomp_peer_waiting",
                        {{"peer", "1"}}),
            0);
  // Even with every message there.
  mailbox.OnMessage(1, Key(1), "here");
  EXPECT_EQ(mailbox.Collect(Key(1), {1}, absl::InfiniteFuture(), Name).status(),
            stopping);
}

TEST(MailboxTest, DeadlineErrorNamesTheMissingRanksAndTheArrivedOnes) {
  PeerMetrics metrics(0, 4);
  Mailbox mailbox(4, {}, &metrics);
  mailbox.OnMessage(2, Key(3, "fc1.weight"), "x");
  auto got = mailbox.Collect(Key(3, "fc1.weight"), {1, 2, 3},
                             absl::Now() + absl::Milliseconds(50), Name);
  ASSERT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(got.status().message(),
              HasSubstr("tensor 'fc1.weight' step 3 round 0 gather: no "
                        "message from rank 1 (test), rank 3 (test) before the "
                        "deadline (ranks 2 arrived)"));
  // Nothing waits any more.
  for (const char* peer : {"1", "2", "3"}) {
    EXPECT_EQ(MetricValue(*metrics.collectable(), "gradcomp_peer_waiting",
                          {{"peer", peer}}),
              0);
  }
}

TEST(MailboxTest, WaitingGaugeShowsTheRanksAStepWaitsOn) {
  PeerMetrics metrics(0, 3);
  Mailbox mailbox(3, {}, &metrics);
  mailbox.OnMessage(1, Key(0), "x");
  std::thread collector([&] {
    EXPECT_TRUE(
        mailbox.Collect(Key(0), {1, 2}, absl::InfiniteFuture(), Name).ok());
  });
  auto waiting = [&](const char* peer) {
    return MetricValue(*metrics.collectable(), "gradcomp_peer_waiting",
                       {{"peer", peer}});
  };
  while (waiting("2") != 1) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_EQ(waiting("1"), 0);
  mailbox.OnMessage(2, Key(0), "y");
  collector.join();
  EXPECT_EQ(waiting("2"), 0);
}

TEST(MailboxTest, LosingAnAwaitedRankFailsTheCollectAtOnce) {
  PeerMetrics metrics(0, 3);
  Mailbox mailbox(3, {}, &metrics);
  mailbox.OnMessage(1, Key(0), "x");
  std::thread killer([&] {
    // Once the Collect below waits for rank 2 (a loss reported before it
    // starts is not this test's case). Rank 1 already sent: its loss does
    // not matter; rank 2's does.
    while (MetricValue(*metrics.collectable(), "gradcomp_peer_waiting",
                       {{"peer", "2"}}) != 1) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    mailbox.OnPeerLost(1, absl::UnavailableError("rank 1 closed"));
    mailbox.OnPeerLost(2, absl::UnavailableError("rank 2 closed"));
  });
  auto got = mailbox.Collect(Key(0), {1, 2}, absl::InfiniteFuture(), Name);
  killer.join();
  ASSERT_EQ(got.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(got.status().message(),
              HasSubstr("rank 2 was lost before it sent its message for job "
                        "'job' tensor 'w' step 0 round 0 gather: rank 2 "
                        "closed"));
}

MessageKey PhaseKey(Phase phase, std::string tensor = "w") {
  return MessageKey{"job", std::move(tensor), 0, 0, phase};
}

TEST(MailboxTest, AMessageOfAnotherKindOfCollectiveFailsTheCollectAtOnce) {
  // It comes while this rank waits and wakes it; the sender need not be one
  // this rank waits for (a neighbour exchange waits for a few).
  PeerMetrics metrics(0, 3);
  Mailbox mailbox(3, {}, &metrics);
  std::thread sender([&] {
    // Once the Collect below waits for rank 1's message.
    while (MetricValue(*metrics.collectable(), "gradcomp_peer_waiting",
                       {{"peer", "1"}}) != 1) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    mailbox.OnMessage(2, PhaseKey(Phase::kGather), "gather");
  });
  auto got = mailbox.Collect(PhaseKey(Phase::kNeighbours), {1},
                             absl::InfiniteFuture(), Name);
  sender.join();
  EXPECT_EQ(got.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(got.status().message(),
              HasSubstr("rank 2 (test) sent a gather message for job 'job' "
                        "tensor 'w' step 0 round 0, where this rank waits "
                        "for neighbours: the ranks reduce this tensor with "
                        "collectives of different kinds"));
}

TEST(MailboxTest, AMessageOfAnotherKindThatCameFirstWaitsForTheDeadline) {
  // Perhaps left from an attempt at this step that this rank gave up before
  // its collective; the deadline error names it.
  Mailbox mailbox(3, {}, nullptr);
  mailbox.OnMessage(2, PhaseKey(Phase::kGather), "topk payload");
  mailbox.OnMessage(1, PhaseKey(Phase::kReduceScatter), "dense slice");
  auto got = mailbox.Collect(PhaseKey(Phase::kReduceScatter), {1, 2},
                             absl::Now() + absl::Milliseconds(50), Name);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(got.status().message(),
              HasSubstr("no message from rank 2 (test) before the deadline "
                        "(ranks 1 arrived); rank 2 (test) sent instead: "
                        "tensor 'w' step 0 round 0 gather"));
}

TEST(MailboxTest, ALaterPhaseOfTheSameCollectiveOrAnotherRoundIsNoMismatch) {
  Mailbox mailbox(2, {}, nullptr);
  // A faster peer already in the allgather, and in the next round.
  mailbox.OnMessage(1, PhaseKey(Phase::kAllgather), "ahead");
  MessageKey next_round = PhaseKey(Phase::kGather);
  next_round.round = 1;
  mailbox.OnMessage(1, next_round, "ahead too");
  std::thread sender([&] {
    mailbox.OnMessage(1, PhaseKey(Phase::kReduceScatter), "scatter");
  });
  auto scatter = mailbox.Collect(PhaseKey(Phase::kReduceScatter), {1},
                                 absl::InfiniteFuture(), Name);
  sender.join();
  ASSERT_TRUE(scatter.ok()) << scatter.status();
  EXPECT_EQ((*scatter)[1], "scatter");
  auto gather = mailbox.Collect(PhaseKey(Phase::kAllgather), {1},
                                absl::InfiniteFuture(), Name);
  ASSERT_TRUE(gather.ok()) << gather.status();
  EXPECT_EQ((*gather)[1], "ahead");
}

TEST(MailboxTest, ADeadlineErrorSaysWhatTheMissingRankSentInstead) {
  Mailbox mailbox(3, {}, nullptr);
  // Rank 1 gossips this job: it sent its gossip spec (an allgather).
  mailbox.OnMessage(1, PhaseKey(Phase::kShardGather, "#gossip-spec"), "spec");
  MessageKey elsewhere = PhaseKey(Phase::kGather);
  elsewhere.job = "other job";
  mailbox.OnMessage(2, elsewhere, "not this job's");
  auto got = mailbox.Collect(PhaseKey(Phase::kReduceScatter), {1, 2},
                             absl::Now() + absl::Milliseconds(50), Name);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(got.status().message(),
              HasSubstr("job 'job' tensor 'w' step 0 round 0 reduce-scatter: "
                        "no message from rank 1 (test), rank 2 (test) before "
                        "the deadline (none of the others arrived); rank 1 "
                        "(test) sent instead: tensor '#gossip-spec' step 0 "
                        "round 0 shard-gather"));
  EXPECT_THAT(got.status().message(),
              ::testing::Not(HasSubstr("rank 2 (test) sent instead")));
  // Every phase has its name (shard and neighbour phases included).
  for (Phase phase : {Phase::kShardScatter, Phase::kNeighbours}) {
    auto late = mailbox.Collect(PhaseKey(phase, "s"), {1}, absl::Now(), Name);
    EXPECT_THAT(late.status().message(),
                HasSubstr(phase == Phase::kShardScatter ? " shard-scatter: "
                                                        : " neighbours: "));
  }
}

TEST(MailboxTest, ALaterLocalStepFreesAndRefusesOlderSteps) {
  PeerMetrics metrics(0, 2);
  Mailbox mailbox(2, {}, &metrics);
  mailbox.OnMessage(1, Key(1), "abandoned");
  mailbox.OnMessage(1, Key(1, "other"), "kept");
  mailbox.BeginStep("job", "w", 2);
  const uint64_t kept = mailbox.SlotBytes(Key(1, "other")) + 4;
  EXPECT_EQ(mailbox.unclaimed_bytes(), kept);
  mailbox.OnMessage(1, Key(1), "too late");
  mailbox.OnCorruptMessage(1, Key(1), absl::DataLossError("damaged"));
  EXPECT_EQ(mailbox.unclaimed_bytes(), kept);
  EXPECT_EQ(MetricValue(*metrics.collectable(),
                        "gradcomp_peer_messages_dropped_total",
                        {{"reason", "stale"}}),
            3);
  // A trainer that restarts from a checkpoint goes back in steps.
  mailbox.BeginStep("job", "w", 0);
  mailbox.OnMessage(1, Key(0), "again");
  EXPECT_TRUE(mailbox.Collect(Key(0), {1}, absl::InfiniteFuture(), Name).ok());
}

// A released job's steps are forgotten: its next run may start again at
// step 0 even when a peer's first message comes before this rank's call.
// Its early messages are freed; other jobs' and a waiting Collect's stay.
TEST(MailboxTest, ForgetJobForgetsItsStepsAndFreesItsMessages) {
  PeerMetrics metrics(0, 2);
  Mailbox mailbox(2, {}, &metrics);
  mailbox.BeginStep("job", "w", 7);
  mailbox.OnMessage(1, Key(8), "left over");
  mailbox.OnMessage(1, MessageKey{"job2", "w", 8, 0, Phase::kGather}, "kept");
  std::thread waiter([&] {
    auto got = mailbox.Collect(Key(9), {1}, absl::InfiniteFuture(), Name);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ((*got)[1], "done");
  });
  while (MetricValue(*metrics.collectable(), "gradcomp_peer_waiting",
                     {{"peer", "1"}}) != 1) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  mailbox.ForgetJob("job");
  const uint64_t kept =
      mailbox.SlotBytes(MessageKey{"job2", "w", 8, 0, Phase::kGather}) + 4;
  EXPECT_EQ(mailbox.unclaimed_bytes(), kept);
  mailbox.OnMessage(1, Key(0), "new run");  // before: stale, dropped
  EXPECT_EQ(mailbox.unclaimed_bytes(), kept + mailbox.SlotBytes(Key(0)) + 7);
  mailbox.OnMessage(1, Key(9), "done");
  waiter.join();
  mailbox.BeginStep("job", "w", 0);
  auto got = mailbox.Collect(Key(0), {1}, absl::InfiniteFuture(), Name);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)[1], "new run");
}

TEST(MailboxTest, EarlyMessagesOverTheCapFailTheirCollective) {
  const uint64_t slot = Mailbox(2, {}, nullptr).SlotBytes(Key(0, "a"));
  MailboxOptions options;
  options.max_unclaimed_bytes = 2 * slot + 8;
  Mailbox mailbox(2, options, nullptr);
  mailbox.OnMessage(1, Key(0, "a"), "12345");
  mailbox.OnMessage(1, Key(0, "b"), "67890");  // 10 > 8: dropped
  EXPECT_EQ(mailbox.unclaimed_bytes(), 2 * slot + 5);
  auto got = mailbox.Collect(Key(0, "b"), {1}, absl::InfiniteFuture(), Name);
  ASSERT_EQ(got.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(got.status().message(), HasSubstr("rank 1"));
  EXPECT_TRUE(
      mailbox.Collect(Key(0, "a"), {1}, absl::InfiniteFuture(), Name).ok());
  EXPECT_EQ(mailbox.unclaimed_bytes(), 0u);
}

// A message that finds the cap full before it has a slot (the peer is
// further ahead on many tensors) is dropped, but its Collect still fails at
// once with RESOURCE_EXHAUSTED naming the sender: before, it waited out
// its deadline and then named the sender as missing, though it had sent.
TEST(MailboxTest, AnEarlyMessageWithoutRoomForItsSlotFailsItsCollectAtOnce) {
  const uint64_t slot = Mailbox(2, {}, nullptr).SlotBytes(Key(0, "a"));
  MailboxOptions options;
  options.max_unclaimed_bytes = slot + 8;
  Mailbox mailbox(2, options, nullptr);
  mailbox.OnMessage(1, Key(0, "a"), "12345");
  mailbox.OnMessage(1, Key(0, "b"), "67890");  // no room for a second slot
  EXPECT_EQ(mailbox.unclaimed_bytes(), slot + 5);
  const absl::Time start = absl::Now();
  auto got = mailbox.Collect(Key(0, "b"), {1}, start + absl::Seconds(30), Name);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  ASSERT_EQ(got.status().code(), absl::StatusCode::kResourceExhausted)
      << got.status();
  EXPECT_THAT(got.status().message(),
              HasSubstr("the message of rank 1 for job 'job' tensor 'b' step "
                        "0 round 0 gather (5 bytes) came before this rank's "
                        "call and did not fit"));
  // The news of a corrupt message that finds no room says it was corrupt;
  // it said a message of 0 bytes had not fitted.
  mailbox.OnCorruptMessage(1, Key(0, "d"), absl::DataLossError("damaged"));
  got =
      mailbox.Collect(Key(0, "d"), {1}, absl::Now() + absl::Seconds(30), Name);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << got.status();
  EXPECT_THAT(got.status().message(),
              HasSubstr("the message of rank 1 for job 'job' tensor 'd' step "
                        "0 round 0 gather came before this rank's call and "
                        "arrived corrupt"));
  // A record goes with its Collect, or once this rank is past its step.
  mailbox.OnMessage(1, Key(0, "c"), "1");
  mailbox.BeginStep("job", "c", 1);
  EXPECT_EQ(
      mailbox.Collect(Key(0, "c"), {1}, absl::Now(), Name).status().code(),
      absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(
      mailbox.Collect(Key(0, "a"), {1}, absl::InfiniteFuture(), Name).ok());
}

// Empty messages (or news of corrupt ones) under ever new names: each
// slot counts its key, so they stop at the cap, the rest dropped as
// overflow. Before, a slot of an empty message counted nothing: a peer
// could hold gigabytes in names alone, for the unclaimed TTL.
TEST(MailboxTest, SlotsOfEmptyMessagesCountAgainstTheCap) {
  PeerMetrics metrics(0, 2);
  const std::string name(4000, 'n');
  const uint64_t slot =
      Mailbox(2, {}, nullptr).SlotBytes(Key(0, name + "0000"));
  MailboxOptions options;
  options.max_unclaimed_bytes = 10 * slot;
  Mailbox mailbox(2, options, &metrics);
  for (int i = 0; i < 100; ++i) {
    const MessageKey key = Key(0, absl::StrFormat("%s%04d", name, i));
    if (i % 2 == 0) {
      mailbox.OnMessage(1, key, "");
    } else {
      mailbox.OnCorruptMessage(1, key, absl::DataLossError("damaged"));
    }
  }
  EXPECT_EQ(mailbox.unclaimed_bytes(), 10 * slot);
  EXPECT_EQ(MetricValue(*metrics.collectable(),
                        "gradcomp_peer_messages_dropped_total",
                        {{"reason", "overflow"}}),
            90);
}

TEST(MailboxTest, UnclaimedMessagesExpire) {
  MailboxOptions options;
  options.unclaimed_ttl = absl::Milliseconds(1);
  Mailbox mailbox(2, options, nullptr);
  mailbox.OnMessage(1, Key(0, "a"), "12345");
  absl::SleepFor(absl::Milliseconds(5));
  mailbox.OnMessage(1, Key(0, "b"), "67");
  EXPECT_EQ(mailbox.unclaimed_bytes(), mailbox.SlotBytes(Key(0, "b")) + 2);
}

// No message need arrive: this rank's own steps free them too (a job that
// ended without ReleaseJob while others go on).
TEST(MailboxTest, UnclaimedMessagesExpireAsThisRankWorks) {
  MailboxOptions options;
  options.unclaimed_ttl = absl::Milliseconds(1);
  Mailbox mailbox(2, options, nullptr);
  mailbox.OnMessage(1, Key(0, "a"), "12345");
  absl::SleepFor(absl::Milliseconds(5));
  mailbox.BeginStep("job", "b", 0);
  EXPECT_EQ(mailbox.unclaimed_bytes(), 0u);

  mailbox.OnMessage(1, Key(0, "c"), "123");
  absl::SleepFor(absl::Milliseconds(5));
  EXPECT_TRUE(mailbox.Collect(Key(0, "d"), {}, absl::Now(), Name).ok());
  EXPECT_EQ(mailbox.unclaimed_bytes(), 0u);
}

// The record of a tensor's current step goes after the TTL without a
// step, so that names used once (a batch id per step, jobs never released)
// do not pile up for the daemon's life: a message for an older step is
// then held (and freed by the TTL) instead of dropped as stale.
TEST(MailboxTest, ATensorsCurrentStepIsForgottenAfterTheTtl) {
  PeerMetrics metrics(0, 2);
  MailboxOptions options;
  options.unclaimed_ttl = absl::Milliseconds(1);
  Mailbox mailbox(2, options, &metrics);
  mailbox.BeginStep("job", "w", 5);
  mailbox.OnMessage(1, Key(3), "stale");
  EXPECT_EQ(mailbox.unclaimed_bytes(), 0u);
  EXPECT_EQ(MetricValue(*metrics.collectable(),
                        "gradcomp_peer_messages_dropped_total",
                        {{"reason", "stale"}}),
            1);
  absl::SleepFor(absl::Milliseconds(5));
  mailbox.BeginStep("job", "other", 0);  // a sweep
  mailbox.OnMessage(1, Key(3), "held");
  EXPECT_EQ(mailbox.unclaimed_bytes(), mailbox.SlotBytes(Key(3)) + 4);
}

TEST(MailboxTest, TwoCollectsOfOneKeyAreRefused) {
  PeerMetrics metrics(0, 2);
  Mailbox mailbox(2, {}, &metrics);
  std::thread first([&] {
    EXPECT_TRUE(
        mailbox.Collect(Key(0), {1}, absl::InfiniteFuture(), Name).ok());
  });
  while (MetricValue(*metrics.collectable(), "gradcomp_peer_waiting",
                     {{"peer", "1"}}) != 1) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  auto second = mailbox.Collect(Key(0), {1}, absl::InfiniteFuture(), Name);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.status().message(), HasSubstr("already being collected"));
  mailbox.OnMessage(1, Key(0), "x");
  first.join();
}

}  // namespace
}  // namespace gradcomp::service
