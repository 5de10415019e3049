// How daemons hand each other messages: a small interface (after NCCL's
// transports) that the collectives use without knowing whether the bytes go
// over gRPC, stay in process (tests) or, later, go through NCCL.
//
//   transport->Send(2, key, payload, deadline);  // queued for rank 2
//   // ... rank 2's Receiver::OnMessage(0, key, bytes) runs when it arrives.
#ifndef GRADCOMP_SERVICE_TRANSPORT_TRANSPORT_H_
#define GRADCOMP_SERVICE_TRANSPORT_TRANSPORT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "codecs/tensor.h"
#include "service/transport/chunk_checksums.h"

namespace gradcomp::service {

// Which step of a collective a message belongs to (peer.proto's Phase).
enum class Phase : uint8_t {
  kGather = 1,
  kReduceScatter = 2,
  kAllgather = 3,
  kShardScatter = 4,
  kShardGather = 5,
  kNeighbours = 6,
};

// The most bytes of a message key's job or tensor name that a peer may
// send: a client's names are at most 1024 bytes (collective.h
// kMaxNameBytes), a batch's key adds a prefix and a digest; a longer one
// ends the peer's stream as a protocol error, before its message is held.
inline constexpr size_t kMaxPeerNameBytes = 4096;

// The rendezvous key of one message: the same on every rank for the same
// (job, tensor, step, round) and collective step, whatever the call order.
struct MessageKey {
  std::string job;
  std::string tensor;
  int64_t step = 0;
  int round = 0;
  Phase phase = Phase::kGather;

  friend bool operator==(const MessageKey& a, const MessageKey& b) {
    return a.step == b.step && a.round == b.round && a.phase == b.phase &&
           a.tensor == b.tensor && a.job == b.job;
  }
  template <typename H>
  friend H AbslHashValue(H h, const MessageKey& k) {
    return H::combine(std::move(h), k.job, k.tensor, k.step, k.round, k.phase);
  }
};

// Where a transport delivers what arrives. Called from transport threads,
// concurrently for different senders.
class Receiver {
 public:
  virtual ~Receiver() = default;
  // A complete message from rank `from`.
  virtual void OnMessage(int from, const MessageKey& key,
                         codecs::Bytes data) = 0;
  // Rank `rank` went away (its connection broke): messages it had not sent
  // yet will not come. `why` names the rank and the cause.
  virtual void OnPeerLost(int rank, const absl::Status& why) = 0;
  // A message from rank `from` arrived damaged (its checksum did not match):
  // the collective waiting for it must fail with `why` (DataLoss, naming the
  // sender and the tensor) instead of using it.
  virtual void OnCorruptMessage(int from, const MessageKey& key,
                                const absl::Status& why) = 0;
};

// The bytes of one outgoing message: `parts` in order, pointing into memory
// that `owner` keeps alive until the transport has written them, so that a
// message can be a slice of a payload plus a small header without a copy.
// Copies share `checksums`: send one message to several peers by copying
// it, and its chunks are checksummed once.
struct OutgoingMessage {
  std::shared_ptr<const void> owner;
  std::vector<absl::string_view> parts;
  std::shared_ptr<ChunkChecksums> checksums =
      std::make_shared<ChunkChecksums>();

  uint64_t size() const {
    uint64_t n = 0;
    for (absl::string_view part : parts) n += part.size();
    return n;
  }
  // The whole of `data`.
  static OutgoingMessage Of(std::shared_ptr<const codecs::Bytes> data) {
    OutgoingMessage message;
    message.parts.push_back(*data);
    message.owner = std::move(data);
    return message;
  }
};

class Transport {
 public:
  virtual ~Transport() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  // "rank 2 (10.0.0.3:50052)": how errors name a peer.
  virtual std::string PeerName(int rank) const = 0;

  // Queues `message` for rank `to` (never this rank); it goes as soon as the
  // peer is connected. Blocks while the peer's queue is full, until
  // `deadline`; then DeadlineExceeded naming the peer. Success means queued,
  // not delivered: a message that cannot reach the peer before `deadline`
  // shows up at the receiver as a missing one.
  virtual absl::Status SendMessage(int to, const MessageKey& key,
                                   OutgoingMessage message,
                                   absl::Time deadline) = 0;

  // The collective of round `round` of (`job`, `tensor`, `step`) failed on
  // this rank: its messages still queued for peers, of every phase, are
  // dropped, not sent. A peer that restarts would otherwise take one in a
  // rerun of that round, where it is stale: the sender's trainer reruns
  // the step with a message of its own (docs/peers.md, "Deadlines and
  // failures"). A message being written when this is called goes.
  // Nothing by default, for transports that hold nothing a restarted peer
  // could get: the in-process one delivers at once, and NCCL's ranks
  // cannot restart within a communicator.
  virtual void Withdraw(absl::string_view /*job*/, absl::string_view /*tensor*/,
                        int64_t /*step*/, int /*round*/) {}

  // SendMessage of the whole of `data`.
  absl::Status Send(int to, const MessageKey& key,
                    std::shared_ptr<const codecs::Bytes> data,
                    absl::Time deadline) {
    return SendMessage(to, key, OutgoingMessage::Of(std::move(data)), deadline);
  }
};

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_TRANSPORT_TRANSPORT_H_
