// The peer layer's Prometheus metrics: bytes per peer and direction,
// collective durations, how many collectives wait on each peer and for how
// long nothing has come from a peer they wait on, and how many peers are
// connected out of how many expected. A registry of its own, exposed next to
// Metrics'.
//
//   PeerMetrics peer_metrics(/*rank=*/0, /*world_size=*/4);
//   peer_metrics.AddBytes(2, Direction::kSent, payload.size());
//   exposer->RegisterCollectable(peer_metrics.collectable());
#ifndef GRADCOMP_SERVICE_METRICS_PEER_METRICS_H_
#define GRADCOMP_SERVICE_METRICS_PEER_METRICS_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace gradcomp::service {

enum class Direction { kSent, kReceived };
enum class Algorithm {
  kAllgather,
  kReduceScatterAllgather,
  kAllToAll,
  kNeighbours,
};

class PeerMetrics {
 public:
  // Series exist from the start for every other rank (label peer="<rank>"),
  // so a peer that never sent anything reads 0, not absent. `now` is the
  // clock of the stall ages (tests pass a fake one).
  PeerMetrics(int rank, int world_size,
              std::function<absl::Time()> now = absl::Now);

  // Message bytes (chunk payloads, not gRPC framing) to or from `peer`.
  void AddBytes(int peer, Direction direction, uint64_t bytes);
  // One finished collective (label collective="allgather",
  // "reduce_scatter_allgather", "all_to_all" or "neighbours").
  void ObserveCollective(Algorithm algorithm, double seconds);
  // `delta` more (or fewer) collectives now wait on a message from `peer`.
  // While any do, gradcomp_peer_stalled_seconds{peer} counts the time since
  // the later of the first of them and the last message from `peer`.
  void AddWaiting(int peer, int delta);
  void SetPeersUp(int peers);
  // gradcomp_peers_starting: 1 from the start (with peers) until the
  // daemon's start-up wait for them ends, when it is set to 0. Missing
  // peers are expected meanwhile (a daemon that does not meet them in
  // time exits), so the peer-down alert leaves those daemons out.
  void EndStarting();
  // A message not handed to any collective: "stale" (an older step),
  // "expired" (unclaimed for too long, or queued to a peer past its
  // deadline), "overflow" (buffer full), "withdrawn" (queued when its own
  // collective failed here).
  void CountDropped(absl::string_view reason);
  // A message from `peer` failed its checksum.
  void CountChecksumFailure(int peer);

  // Reads this object when scraped: unregister it (or destroy the exposer)
  // before this object goes.
  std::shared_ptr<prometheus::Collectable> collectable() const {
    return collector_;
  }

 private:
  class Collector;
  struct Wait {
    int count = 0;
    absl::Time since;  // when `count` last left 0, or the last message
  };

  // Seconds each peer has stalled, by rank (0 for this rank and for peers
  // nothing waits on).
  std::vector<double> StalledSeconds() const ABSL_LOCKS_EXCLUDED(mu_);

  const int rank_;
  const std::function<absl::Time()> now_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<prometheus::Collectable> collector_;
  std::array<prometheus::Histogram*, 4> collective_;
  prometheus::Family<prometheus::Counter>& dropped_;
  prometheus::Gauge& peers_up_;
  prometheus::Gauge& peers_starting_;
  // Indexed by rank; this rank's entries stay null.
  std::vector<prometheus::Counter*> sent_;
  std::vector<prometheus::Counter*> received_;
  std::vector<prometheus::Counter*> checksum_failures_;
  std::vector<prometheus::Gauge*> waiting_;

  mutable absl::Mutex mu_;
  std::vector<Wait> waits_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_METRICS_PEER_METRICS_H_
