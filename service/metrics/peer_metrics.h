// The peer layer's Prometheus metrics: bytes per peer and direction,
// collective durations, how many collectives wait on each peer, and how many
// peers are connected. A registry of its own, exposed next to Metrics'.
//
//   PeerMetrics peer_metrics(/*rank=*/0, /*world_size=*/4);
//   peer_metrics.AddBytes(2, Direction::kSent, payload.size());
//   exposer->RegisterCollectable(peer_metrics.collectable());
#ifndef GRADCOMP_SERVICE_METRICS_PEER_METRICS_H_
#define GRADCOMP_SERVICE_METRICS_PEER_METRICS_H_

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/strings/string_view.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace gradcomp::service {

enum class Direction { kSent, kReceived };
enum class Algorithm { kAllgather, kReduceScatterAllgather };

class PeerMetrics {
 public:
  // Series exist from the start for every other rank (label peer="<rank>"),
  // so a peer that never sent anything reads 0, not absent.
  PeerMetrics(int rank, int world_size);

  // Message bytes (chunk payloads, not gRPC framing) to or from `peer`.
  void AddBytes(int peer, Direction direction, uint64_t bytes);
  // One finished collective (label collective="allgather" or
  // "reduce_scatter_allgather").
  void ObserveCollective(Algorithm algorithm, double seconds);
  // `delta` more (or fewer) collectives now wait on a message from `peer`.
  void AddWaiting(int peer, int delta);
  void SetPeersUp(int peers);
  // A message not handed to any collective: "stale" (an older step),
  // "expired" (unclaimed for too long), "overflow" (buffer full).
  void CountDropped(absl::string_view reason);

  std::shared_ptr<prometheus::Collectable> collectable() const {
    return registry_;
  }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  std::array<prometheus::Histogram*, 2> collective_;
  prometheus::Family<prometheus::Counter>& dropped_;
  prometheus::Gauge& peers_up_;
  // Indexed by rank; this rank's entries stay null.
  std::vector<prometheus::Counter*> sent_;
  std::vector<prometheus::Counter*> received_;
  std::vector<prometheus::Gauge*> waiting_;
};

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_METRICS_PEER_METRICS_H_
