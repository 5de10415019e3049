#include "service/metrics/peer_metrics.h"

#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "service/metrics/metrics_testing.h"

namespace gradcomp::service {
namespace {

TEST(PeerMetricsTest, EveryOtherRankHasSeriesFromTheStart) {
  PeerMetrics metrics(/*rank=*/1, /*world_size=*/3);
  const auto& c = *metrics.collectable();
  for (const char* peer : {"0", "2"}) {
    EXPECT_EQ(MetricValue(c, "gradcomp_peer_bytes_total",
                          {{"peer", peer}, {"direction", "sent"}}),
              0);
    EXPECT_EQ(MetricValue(c, "gradcomp_peer_waiting", {{"peer", peer}}), 0);
  }
  EXPECT_EQ(MetricValue(c, "gradcomp_peers_up"), 0);
  EXPECT_EQ(MetricValue(c, "gradcomp_peers_expected"), 2);
  EXPECT_EQ(MetricValue(c, "gradcomp_peer_stalled_seconds", {{"peer", "2"}}),
            0);
}

TEST(PeerMetricsTest, StartingUntilTheStartUpWaitEndsOnlyWithPeers) {
  PeerMetrics peered(/*rank=*/0, /*world_size=*/3);
  EXPECT_EQ(MetricValue(*peered.collectable(), "gradcomp_peers_starting"), 1);
  peered.EndStarting();
  EXPECT_EQ(MetricValue(*peered.collectable(), "gradcomp_peers_starting"), 0);
  PeerMetrics alone(/*rank=*/0, /*world_size=*/1);
  EXPECT_EQ(MetricValue(*alone.collectable(), "gradcomp_peers_starting"), 0);
}

TEST(PeerMetricsTest, StallCountsFromFirstWaitOrLastMessageWhileWaiting) {
  absl::Time now = absl::UnixEpoch();
  PeerMetrics metrics(/*rank=*/0, /*world_size=*/3, [&now] { return now; });
  const auto& c = *metrics.collectable();
  auto stalled = [&c](const char* peer) {
    return MetricValue(c, "gradcomp_peer_stalled_seconds", {{"peer", peer}});
  };
  metrics.AddWaiting(2, 1);
  now += absl::Seconds(10);
  metrics.AddWaiting(2, 1);  // a second wait does not restart the clock
  now += absl::Seconds(5);
  EXPECT_EQ(stalled("2"), 15);
  EXPECT_EQ(stalled("1"), 0);
  metrics.AddBytes(2, Direction::kReceived, 8);  // progress from the peer
  now += absl::Seconds(3);
  EXPECT_EQ(stalled("2"), 3);
  metrics.AddBytes(2, Direction::kSent, 8);  // our own sends are no progress
  now += absl::Seconds(1);
  EXPECT_EQ(stalled("2"), 4);
  metrics.AddWaiting(2, -2);
  EXPECT_EQ(stalled("2"), 0);
}

TEST(PeerMetricsTest, BytesWaitingUpDurationAndDrops) {
  PeerMetrics metrics(/*rank=*/0, /*world_size=*/3);
  metrics.AddBytes(2, Direction::kSent, 100);
  metrics.AddBytes(2, Direction::kSent, 20);
  metrics.AddBytes(1, Direction::kReceived, 7);
  metrics.AddWaiting(2, 3);
  metrics.AddWaiting(2, -1);
  metrics.SetPeersUp(2);
  metrics.ObserveCollective(Algorithm::kAllgather, 0.01);
  metrics.CountDropped("stale");
  const auto& c = *metrics.collectable();
  EXPECT_EQ(MetricValue(c, "gradcomp_peer_bytes_total",
                        {{"peer", "2"}, {"direction", "sent"}}),
            120);
  EXPECT_EQ(MetricValue(c, "gradcomp_peer_bytes_total",
                        {{"peer", "1"}, {"direction", "received"}}),
            7);
  EXPECT_EQ(MetricValue(c, "gradcomp_peer_waiting", {{"peer", "2"}}), 2);
  EXPECT_EQ(MetricValue(c, "gradcomp_peers_up"), 2);
  EXPECT_EQ(MetricValue(c, "gradcomp_collective_duration_seconds",
                        {{"collective", "allgather"}}),
            1);
  EXPECT_EQ(MetricValue(c, "gradcomp_peer_messages_dropped_total",
                        {{"reason", "stale"}}),
            1);
}

}  // namespace
}  // namespace gradcomp::service
