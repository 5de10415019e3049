// How the engine exchanges one round's payload with the other workers of a
// job. The engine calls Run once per round and gets back the summed dense
// bodies (kSum) or every worker's payload (kGather); implementations decide
// how (in-process for world size 1, over peers). Sharded aggregation uses
// the two plain exchanges AllToAll and Allgather; gossip uses
// ExchangeWithNeighbours.
//
//   GC_ASSIGN_OR_RETURN(codecs::RoundResult result,
//                       collective.Run({job, tensor, step, 0},
//                       std::move(round)));
#ifndef GRADCOMP_SERVICE_COLLECTIVE_COLLECTIVE_H_
#define GRADCOMP_SERVICE_COLLECTIVE_COLLECTIVE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "codecs/codec.h"

namespace gradcomp::service {

// The most bytes of a job or tensor name, or a batch id (in its batch's
// key): names travel in every peer message of their tensor, in its first
// frame, which the peers' gRPC reads whole.
inline constexpr size_t kMaxNameBytes = 1024;

// InvalidArgument if `name` is longer than kMaxNameBytes; `what` names it
// ("job name", "batch id").
inline absl::Status CheckNameLength(absl::string_view what,
                                    absl::string_view name) {
  if (name.size() <= kMaxNameBytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      what, " has ", name.size(), " bytes, expected at most ", kMaxNameBytes));
}

// Rendezvous key: every worker's call for the same key meets in the same
// collective, whatever order tensors arrive in.
struct RoundKey {
  std::string job;
  std::string tensor;
  int64_t step = 0;
  int round = 0;
};

class Collective {
 public:
  virtual ~Collective() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  // Contributes `round.payload` and returns the round's result. Must be
  // thread-safe: the engine runs many tensors at once.
  virtual absl::StatusOr<codecs::RoundResult> Run(const RoundKey& key,
                                                  codecs::Round round) = 0;

  // The two exchanges of sharded aggregation (sharded_reduce.h), with the
  // same thread-safety and deadline as Run. AllToAll sends parts[j] to rank
  // j (world_size() parts; parts[rank()] stays here) and returns, in rank
  // order, the part every rank sent to this one.
  virtual absl::StatusOr<std::vector<codecs::Bytes>> AllToAll(
      const RoundKey& key, std::vector<codecs::Bytes> parts) = 0;
  // Every rank's `part`, in rank order.
  virtual absl::StatusOr<std::vector<codecs::Bytes>> Allgather(
      const RoundKey& key, codecs::Bytes part) = 0;

  // Gossip's exchange (NEIGHBOURS rounds, service/gossip/): sends parts[k]
  // to rank neighbours[k] and returns, in the same order, the part each of
  // them sent to this rank, with the same thread-safety and deadline as Run.
  // `neighbours` are distinct ranks other than this one. The default, for
  // collectives that cannot gossip (decorators that only batch SUM rounds),
  // is Unimplemented.
  virtual absl::StatusOr<std::vector<codecs::Bytes>> ExchangeWithNeighbours(
      const RoundKey& key, absl::Span<const int> /*neighbours*/,
      std::vector<codecs::Bytes> /*parts*/) {
    return absl::UnimplementedError(
        "tensor '" + key.tensor +
        "': this collective has no neighbour exchange (gossip)");
  }

  // `job` is over on this rank (Engine::ReleaseJob): what the collective
  // keeps per job (rendezvous steps, early messages) may go. Nothing by
  // default, for collectives that keep nothing per job.
  virtual void ForgetJob(const std::string& /*job*/) {}

  // The daemon is stopping: every call waiting for peers ends at once with
  // `why`, and later calls fail with it, so that in-flight requests answer
  // and the daemon exits within its grace period instead of at their
  // deadlines. Nothing by default, for collectives that never wait.
  virtual void Shutdown(const absl::Status& /*why*/) {}
};

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_COLLECTIVE_COLLECTIVE_H_
