// One round of the NCCL transport's wire protocol over one communicator: every
// rank sends each of its peers a fixed 16-byte header (is there a message, how
// many bytes), receives one from each, then sends and receives the payloads
// whose sizes it now knows. Every rank runs the same rounds, so the NCCL calls
// always match and nothing waits on a message that was never announced.
//
//   GC_ASSIGN_OR_RETURN(auto exchange, NcclExchange::Create(id, 4, rank, 0,
//                                                           absl::Seconds(30)));
//   std::vector<NcclExchange::Outgoing> out(peers.size());
//   out[0] = {true, {header, payload}};
//   GC_ASSIGN_OR_RETURN(auto in, exchange->Run(peers, out, deadline));
//
// Payloads go host -> pinned staging -> device -> ncclSend, and back the same
// way: one stream, buffers that only grow. A communicator that failed (an NCCL
// error, or a round past its deadline) is aborted and every later call fails.
#ifndef GRADCOMP_SERVICE_TRANSPORT_NCCL_TRANSPORT_EXCHANGE_H_
#define GRADCOMP_SERVICE_TRANSPORT_NCCL_TRANSPORT_EXCHANGE_H_

#include <nccl.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "codecs/cuda/device.h"
#include "codecs/tensor.h"

namespace gradcomp::service {

// OK for ncclSuccess; otherwise an error naming `what`, `rank` and NCCL's
// error string (Unavailable for system and remote errors, Internal else).
absl::Status NcclStatus(ncclResult_t result, const char* what, int rank);

// A new ncclUniqueId as its bytes (NCCL_UNIQUE_ID_BYTES), made by rank 0 and
// handed to the others. Needs no GPU.
absl::StatusOr<std::string> NewNcclUniqueId();

class NcclExchange {
 public:
  // What this rank sends one peer in a round: nothing, or the concatenation
  // of `parts` (which must stay valid during Run).
  struct Outgoing {
    bool present = false;
    std::vector<absl::string_view> parts;
  };

  // Joins the communicator `unique_id` (NewNcclUniqueId's bytes) as `rank` of
  // `world_size` on CUDA device `device`. InvalidArgument for an id of the
  // wrong size or a rank outside the world; Unavailable without a usable GPU;
  // DeadlineExceeded (and the communicator aborted) when the other ranks do
  // not join within `timeout`.
  static absl::StatusOr<std::unique_ptr<NcclExchange>> Create(
      absl::string_view unique_id, int world_size, int rank, int device,
      absl::Duration timeout);

  NcclExchange(const NcclExchange&) = delete;
  NcclExchange& operator=(const NcclExchange&) = delete;
  ~NcclExchange();

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }

  // One round with `peers` (distinct ranks; this rank itself is allowed and
  // goes through NCCL as a loopback): sends `out[i]` to `peers[i]` and
  // returns what each peer sent (nullopt: nothing this round). Every peer
  // must run a round with this rank at the same time. Past `deadline`, or on
  // any NCCL or CUDA error, the communicator is aborted and the error
  // (naming this rank) returned; so is every later call.
  absl::StatusOr<std::vector<std::optional<codecs::Bytes>>> Run(
      const std::vector<int>& peers, const std::vector<Outgoing>& out,
      absl::Time deadline);

 private:
  struct PinnedDeleter {
    void operator()(char* p) const;
  };
  using PinnedBuffer = std::unique_ptr<char, PinnedDeleter>;
  // A grow-only pinned host block and a device block of the same size.
  struct Staging {
    PinnedBuffer host;
    codecs::cuda::DeviceBuffer device;
    uint64_t capacity = 0;
  };

  NcclExchange(ncclComm_t comm, cudaStream_t stream, int world_size, int rank,
               int device);

  absl::Status Grow(Staging& staging, uint64_t bytes);
  // Ends the group (also when queuing into it failed, so that this thread's
  // NCCL group state stays clean) and returns the first error. A
  // non-blocking communicator may return from ncclGroupEnd before it has put
  // the group on the stream (ncclInProgress): waits until it has, so that
  // copies queued after it run after it.
  absl::Status EndGroup(const absl::Status& queued, absl::Time deadline);
  // Waits for the stream, watching the communicator's asynchronous error,
  // until `deadline`.
  absl::Status Wait(absl::Time deadline);
  absl::StatusOr<std::vector<std::optional<codecs::Bytes>>> RunRound(
      const std::vector<int>& peers, const std::vector<Outgoing>& out,
      absl::Time deadline);
  void Abort();

  ncclComm_t comm_;
  cudaStream_t stream_;
  const int world_size_;
  const int rank_;
  const int device_;
  absl::Status broken_;
  Staging headers_out_;
  Staging headers_in_;
  std::vector<Staging> payload_out_;  // one per peer position
  std::vector<Staging> payload_in_;
};

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_TRANSPORT_NCCL_TRANSPORT_EXCHANGE_H_
