#include "service/metrics/peer_metrics.h"

#include <string>

namespace gradcomp::service {
namespace {

// 100 us (a small tensor on loopback) .. ~100 s (a deadline), doubling.
prometheus::Histogram::BucketBoundaries CollectiveBuckets() {
  prometheus::Histogram::BucketBoundaries b;
  for (double v = 1e-4; v < 120; v *= 2) b.push_back(v);
  return b;
}

}  // namespace

PeerMetrics::PeerMetrics(int rank, int world_size)
    : registry_(std::make_shared<prometheus::Registry>()),
      dropped_(prometheus::BuildCounter()
                   .Name("gradcomp_peer_messages_dropped_total")
                   .Help("Peer messages no collective claimed, by reason.")
                   .Register(*registry_)),
      peers_up_(prometheus::BuildGauge()
                    .Name("gradcomp_peers_up")
                    .Help("Peers this daemon is connected to and has "
                          "handshaken with.")
                    .Register(*registry_)
                    .Add({})),
      sent_(world_size, nullptr),
      received_(world_size, nullptr),
      waiting_(world_size, nullptr) {
  auto& bytes = prometheus::BuildCounter()
                    .Name("gradcomp_peer_bytes_total")
                    .Help("Message bytes exchanged with each peer.")
                    .Register(*registry_);
  auto& waiting = prometheus::BuildGauge()
                      .Name("gradcomp_peer_waiting")
                      .Help(
                          "Collectives now waiting on a message from each "
                          "peer.")
                      .Register(*registry_);
  auto& collective = prometheus::BuildHistogram()
                         .Name("gradcomp_collective_duration_seconds")
                         .Help(
                             "Time of one collective across the peers, by "
                             "algorithm.")
                         .Register(*registry_);
  collective_[static_cast<int>(Algorithm::kAllgather)] =
      &collective.Add({{"collective", "allgather"}}, CollectiveBuckets());
  collective_[static_cast<int>(Algorithm::kReduceScatterAllgather)] =
      &collective.Add({{"collective", "reduce_scatter_allgather"}},
                      CollectiveBuckets());
  for (int peer = 0; peer < world_size; ++peer) {
    if (peer == rank) continue;
    const std::string label = std::to_string(peer);
    sent_[peer] = &bytes.Add({{"peer", label}, {"direction", "sent"}});
    received_[peer] = &bytes.Add({{"peer", label}, {"direction", "received"}});
    waiting_[peer] = &waiting.Add({{"peer", label}});
  }
}

void PeerMetrics::AddBytes(int peer, Direction direction, uint64_t bytes) {
  auto& counters = direction == Direction::kSent ? sent_ : received_;
  counters[peer]->Increment(static_cast<double>(bytes));
}

void PeerMetrics::ObserveCollective(Algorithm algorithm, double seconds) {
  collective_[static_cast<int>(algorithm)]->Observe(seconds);
}

void PeerMetrics::AddWaiting(int peer, int delta) {
  waiting_[peer]->Increment(delta);
}

void PeerMetrics::SetPeersUp(int peers) { peers_up_.Set(peers); }

void PeerMetrics::CountDropped(absl::string_view reason) {
  dropped_.Add({{"reason", std::string(reason)}}).Increment();
}

}  // namespace gradcomp::service
