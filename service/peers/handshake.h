// What two daemons must agree on before they exchange payloads, and the
// check each side runs on the other's Hello: release version, wire format,
// protocol, world size, rank (distinct, and the one that was dialled),
// policy hash and codec seed. A refusal names both sides.
//
//   PeerIdentity mine = ...;
//   GC_RETURN_IF_ERROR(CheckPeer(mine, theirs, /*dialled_rank=*/2, address));
#ifndef GRADCOMP_SERVICE_PEERS_HANDSHAKE_H_
#define GRADCOMP_SERVICE_PEERS_HANDSHAKE_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"

namespace gradcomp::service {

// Bumped when peer.proto's messages change meaning.
// 2: chunks carry a CRC-32C.
// 3: a SUM round's reduce-scatter head carries the codec's parameter block;
//    a batch's summed slots count absences, not presences.
inline constexpr uint32_t kPeerProtocolVersion = 3;

struct PeerIdentity {
  std::string version;
  uint32_t wire_version = 0;
  uint32_t protocol_version = kPeerProtocolVersion;
  int world_size = 1;
  int rank = 0;
  std::string policy_hash;
  uint64_t seed = 0;
  uint64_t instance = 0;  // random per process
  std::string group;      // --peer_group, "" when unset
};

// OK when `remote` may join `local`'s job; otherwise FailedPrecondition
// that names both ranks, their values and `remote_address`.
// `dialled_rank` is the rank this side expected at `remote_address` (the
// dialer's view: peers[dialled_rank]); nullopt on the listening side.
absl::Status CheckPeer(const PeerIdentity& local, const PeerIdentity& remote,
                       std::optional<int> dialled_rank,
                       const std::string& remote_address);

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_PEERS_HANDSHAKE_H_
