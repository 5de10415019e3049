#include "service/metrics/peer_metrics.h"

#include <string>
#include <utility>

#include "prometheus/metric_family.h"

namespace gradcomp::service {
namespace {

// 100 us (a small tensor on loopback) .. ~100 s (a deadline), doubling.
prometheus::Histogram::BucketBoundaries CollectiveBuckets() {
  prometheus::Histogram::BucketBoundaries b;
  for (double v = 1e-4; v < 120; v *= 2) b.push_back(v);
  return b;
}

}  // namespace

// The registry's metrics plus the stall ages, computed when scraped.
class PeerMetrics::Collector : public prometheus::Collectable {
 public:
  explicit Collector(const PeerMetrics* metrics) : metrics_(metrics) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    std::vector<prometheus::MetricFamily> families =
        metrics_->registry_->Collect();
    prometheus::MetricFamily stalled;
    stalled.name = "gradcomp_peer_stalled_seconds";
    stalled.help =
        "Seconds collectives have waited on each peer with nothing arriving "
        "from it; 0 when none waits.";
    stalled.type = prometheus::MetricType::Gauge;
    const std::vector<double> seconds = metrics_->StalledSeconds();
    for (int peer = 0; peer < static_cast<int>(seconds.size()); ++peer) {
      if (peer == metrics_->rank_) continue;
      prometheus::ClientMetric metric;
      metric.label.push_back({"peer", std::to_string(peer)});
      metric.gauge.value = seconds[peer];
      stalled.metric.push_back(std::move(metric));
    }
    families.push_back(std::move(stalled));
    return families;
  }

 private:
  const PeerMetrics* metrics_;
};

PeerMetrics::PeerMetrics(int rank, int world_size,
                         std::function<absl::Time()> now)
    : rank_(rank),
      now_(std::move(now)),
      registry_(std::make_shared<prometheus::Registry>()),
      collector_(std::make_shared<Collector>(this)),
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
      peers_starting_(prometheus::BuildGauge()
                          .Name("gradcomp_peers_starting")
                          .Help("1 while the daemon waits for its peers at "
                                "start-up (it exits if they do not come in "
                                "time), then 0.")
                          .Register(*registry_)
                          .Add({})),
      sent_(world_size, nullptr),
      received_(world_size, nullptr),
      checksum_failures_(world_size, nullptr),
      waiting_(world_size, nullptr),
      waits_(world_size) {
  prometheus::BuildGauge()
      .Name("gradcomp_peers_expected")
      .Help("Peers this daemon should be connected to: world_size - 1.")
      .Register(*registry_)
      .Add({})
      .Set(world_size - 1);
  peers_starting_.Set(world_size > 1 ? 1 : 0);
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
  collective_[static_cast<int>(Algorithm::kAllToAll)] =
      &collective.Add({{"collective", "all_to_all"}}, CollectiveBuckets());
  collective_[static_cast<int>(Algorithm::kNeighbours)] =
      &collective.Add({{"collective", "neighbours"}}, CollectiveBuckets());
  auto& checksum_failures =
      prometheus::BuildCounter()
          .Name("gradcomp_peer_checksum_failures_total")
          .Help(
              "Messages from each peer whose CRC-32C did not match (their "
              "collectives failed with DATA_LOSS).")
          .Register(*registry_);
  for (int peer = 0; peer < world_size; ++peer) {
    if (peer == rank) continue;
    const std::string label = std::to_string(peer);
    checksum_failures_[peer] = &checksum_failures.Add({{"peer", label}});
    sent_[peer] = &bytes.Add({{"peer", label}, {"direction", "sent"}});
    received_[peer] = &bytes.Add({{"peer", label}, {"direction", "received"}});
    waiting_[peer] = &waiting.Add({{"peer", label}});
  }
}

void PeerMetrics::AddBytes(int peer, Direction direction, uint64_t bytes) {
  auto& counters = direction == Direction::kSent ? sent_ : received_;
  counters[peer]->Increment(static_cast<double>(bytes));
  if (direction == Direction::kReceived) {
    absl::MutexLock lock(&mu_);
    waits_[peer].since = now_();
  }
}

void PeerMetrics::CountChecksumFailure(int peer) {
  checksum_failures_[peer]->Increment();
}

void PeerMetrics::ObserveCollective(Algorithm algorithm, double seconds) {
  collective_[static_cast<int>(algorithm)]->Observe(seconds);
}

void PeerMetrics::AddWaiting(int peer, int delta) {
  waiting_[peer]->Increment(delta);
  absl::MutexLock lock(&mu_);
  Wait& wait = waits_[peer];
  if (wait.count == 0 && delta > 0) wait.since = now_();
  wait.count += delta;
}

std::vector<double> PeerMetrics::StalledSeconds() const {
  const absl::Time now = now_();
  absl::MutexLock lock(&mu_);
  std::vector<double> seconds(waits_.size(), 0.0);
  for (size_t peer = 0; peer < waits_.size(); ++peer) {
    if (waits_[peer].count > 0) {
      seconds[peer] = absl::ToDoubleSeconds(now - waits_[peer].since);
    }
  }
  return seconds;
}

void PeerMetrics::SetPeersUp(int peers) { peers_up_.Set(peers); }

void PeerMetrics::EndStarting() { peers_starting_.Set(0); }

void PeerMetrics::CountDropped(absl::string_view reason) {
  dropped_.Add({{"reason", std::string(reason)}}).Increment();
}

}  // namespace gradcomp::service
