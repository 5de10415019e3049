// The collectives of several daemons over a Transport: GATHER rounds by
// allgather (every rank sends its payload to every other), SUM rounds by
// reduce-scatter + allgather of the payloads' dense bodies (rank j owns
// slice j, adds the W slices in fp32 in rank order, and sends the sum back
// to everyone). Results are bit-identical on every rank. Every Run has a
// deadline; a missing peer fails it with an error naming that rank.
//
//   Mailbox mailbox(4, {}, &peer_metrics);
//   std::unique_ptr<Transport> transport = ...;  // delivers into mailbox
//   PeerCollective collective(transport.get(), &mailbox, {}, &peer_metrics);
//   GC_ASSIGN_OR_RETURN(auto result, collective.Run(key, std::move(round)));
#ifndef GRADCOMP_SERVICE_COLLECTIVE_PEER_COLLECTIVE_H_
#define GRADCOMP_SERVICE_COLLECTIVE_PEER_COLLECTIVE_H_

#include <memory>
#include <vector>

#include "absl/time/time.h"
#include "service/collective/collective.h"
#include "service/collective/mailbox.h"
#include "service/metrics/peer_metrics.h"
#include "service/transport/transport.h"

namespace gradcomp::service {

struct PeerCollectiveOptions {
  // How long one Run may wait for the other ranks (their calls, their
  // bytes), from the moment this rank calls it.
  absl::Duration timeout = absl::Seconds(60);
};

class PeerCollective : public Collective {
 public:
  // `transport` must deliver into `mailbox`; `metrics` may be null. All
  // three must outlive the collective.
  PeerCollective(Transport* transport, Mailbox* mailbox,
                 PeerCollectiveOptions options, PeerMetrics* metrics);

  int rank() const override { return transport_->rank(); }
  int world_size() const override { return transport_->world_size(); }

  absl::StatusOr<codecs::RoundResult> Run(const RoundKey& key,
                                          codecs::Round round) override;
  absl::StatusOr<std::vector<codecs::Bytes>> AllToAll(
      const RoundKey& key, std::vector<codecs::Bytes> parts) override;
  absl::StatusOr<std::vector<codecs::Bytes>> Allgather(
      const RoundKey& key, codecs::Bytes part) override;

  // --- Gossip (service/gossip/): neighbour exchange, phase NEIGHBOURS.
  absl::StatusOr<std::vector<codecs::Bytes>> ExchangeWithNeighbours(
      const RoundKey& key, absl::Span<const int> neighbours,
      std::vector<codecs::Bytes> parts) override;
  // --- end gossip.

  void ForgetJob(const std::string& job) override;
  void Shutdown(const absl::Status& why) override;

 private:
  absl::StatusOr<std::vector<codecs::Bytes>> AllgatherPhase(
      const MessageKey& key, codecs::Bytes payload, absl::Time deadline);
  // The sum goes into `sum_into` when that has the body's length (the
  // round's), else into the result's own vector.
  absl::StatusOr<codecs::RoundResult> ReduceScatterAllgather(
      const RoundKey& key, std::shared_ptr<const codecs::Bytes> payload,
      absl::Span<float> sum_into, absl::Time deadline);

  // A failed call's messages still queued for peers are dropped
  // (Transport::Withdraw): a restarted peer must not take them in a rerun.
  void WithdrawQueued(const RoundKey& key);

  // Sends `data` to every other rank, starting after this one so that the
  // ranks do not all write to rank 0 first.
  absl::Status SendToOthers(const MessageKey& key,
                            std::shared_ptr<const codecs::Bytes> data,
                            absl::Time deadline);
  absl::StatusOr<std::vector<codecs::Bytes>> CollectFromOthers(
      const MessageKey& key, absl::Time deadline);

  Transport* const transport_;
  Mailbox* const mailbox_;
  const PeerCollectiveOptions options_;
  PeerMetrics* const metrics_;
  std::vector<int> others_;
};

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_COLLECTIVE_PEER_COLLECTIVE_H_
