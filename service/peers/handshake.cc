#include "service/peers/handshake.h"

#include "absl/strings/str_cat.h"

namespace gradcomp::service {
namespace {

template <typename T>
absl::Status Mismatch(const PeerIdentity& local, const PeerIdentity& remote,
                      const std::string& address, absl::string_view what,
                      const T& mine, const T& theirs,
                      absl::string_view expectation) {
  return absl::FailedPreconditionError(absl::StrCat(
      "peer handshake refused: ", what, " is ", theirs, " on rank ",
      remote.rank, " (", address, ") but ", mine, " on rank ", local.rank,
      " (this daemon); expected ", expectation));
}

}  // namespace

absl::Status CheckPeer(const PeerIdentity& local, const PeerIdentity& remote,
                       std::optional<int> dialled_rank,
                       const std::string& remote_address) {
  const std::string& a = remote_address;
  if (remote.protocol_version != local.protocol_version) {
    return Mismatch(local, remote, a, "the peer protocol version",
                    local.protocol_version, remote.protocol_version,
                    "the same gradcompd release on every rank");
  }
  if (remote.version != local.version) {
    return Mismatch(local, remote, a, "the gradcompd version",
                    "'" + local.version + "'", "'" + remote.version + "'",
                    "the same gradcompd release on every rank");
  }
  if (remote.wire_version != local.wire_version) {
    return Mismatch(local, remote, a, "the wire format version",
                    local.wire_version, remote.wire_version,
                    "the same payload format on every rank");
  }
  if (remote.group != local.group) {
    return Mismatch(local, remote, a, "the peer group", "'" + local.group + "'",
                    "'" + remote.group + "'",
                    "the same --peer_group on every daemon of a job (is this "
                    "a daemon of another job or release?)");
  }
  if (remote.world_size != local.world_size) {
    return Mismatch(local, remote, a, "world_size", local.world_size,
                    remote.world_size, "the same --world_size on every rank");
  }
  if (remote.instance == local.instance) {
    const std::string dialled =
        dialled_rank.has_value()
            ? absl::StrCat(" (dialled as rank ", *dialled_rank,
                           ", --peers entry ", *dialled_rank, ")")
            : "";
    return absl::FailedPreconditionError(absl::StrCat(
        "peer handshake refused: rank ", local.rank, " reached itself at ", a,
        dialled,
        "; expected every --peers entry to be another rank's address, not one "
        "this daemon listens on (is another rank's --peers entry the same as "
        "this daemon's --listen?)"));
  }
  if (remote.rank < 0 || remote.rank >= local.world_size ||
      remote.rank == local.rank) {
    return absl::FailedPreconditionError(absl::StrCat(
        "peer handshake refused: the daemon at ", a, " says it is rank ",
        remote.rank, " and this daemon is rank ", local.rank, " of ",
        local.world_size, "; expected distinct ranks in [0, ", local.world_size,
        ") (is --rank the same on two daemons?)"));
  }
  if (dialled_rank.has_value() && remote.rank != *dialled_rank) {
    return absl::FailedPreconditionError(absl::StrCat(
        "peer handshake refused: rank ", local.rank, " dialled ", a,
        " as rank ", *dialled_rank, " (--peers entry ", *dialled_rank,
        ") but the daemon there is rank ", remote.rank,
        "; expected --peers listed by rank, the same on every daemon"));
  }
  if (remote.policy_hash != local.policy_hash) {
    return Mismatch(local, remote, a, "the policy hash",
                    "'" + local.policy_hash + "'",
                    "'" + remote.policy_hash + "'",
                    "the same policies on every rank for every step "
                    "(compare GetPolicy; after a SetPolicy with from_step the "
                    "hash covers each step's policy, and a restarted rank "
                    "needs the same scheduled_policies in its config)");
  }
  if (remote.seed != local.seed) {
    return Mismatch(local, remote, a, "the codec seed", local.seed, remote.seed,
                    "the same --seed on every rank");
  }
  return absl::OkStatus();
}

}  // namespace gradcomp::service
