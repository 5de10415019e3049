// The collective of a single worker (world size 1): the sum is this
// worker's own dense body and the gather is its own payload. It still
// validates payloads, so a codec bug surfaces here as it would with peers.
//
//   LocalCollective collective;
//   GC_ASSIGN_OR_RETURN(auto result, collective.Run(key, std::move(round)));
#ifndef GRADCOMP_SERVICE_COLLECTIVE_LOCAL_COLLECTIVE_H_
#define GRADCOMP_SERVICE_COLLECTIVE_LOCAL_COLLECTIVE_H_

#include "service/collective/collective.h"

namespace gradcomp::service {

class LocalCollective : public Collective {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }

  absl::StatusOr<codecs::RoundResult> Run(const RoundKey& key,
                                          codecs::Round round) override;
  absl::StatusOr<std::vector<codecs::Bytes>> AllToAll(
      const RoundKey& key, std::vector<codecs::Bytes> parts) override;
  absl::StatusOr<std::vector<codecs::Bytes>> Allgather(
      const RoundKey& key, codecs::Bytes part) override;
  // A single worker has no neighbours: `neighbours` must be empty.
  absl::StatusOr<std::vector<codecs::Bytes>> ExchangeWithNeighbours(
      const RoundKey& key, absl::Span<const int> neighbours,
      std::vector<codecs::Bytes> parts) override;
};

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_COLLECTIVE_LOCAL_COLLECTIVE_H_
