// The message a GATHER batch allgathers (batching_collective.h): every
// member's payload whole, members in sorted-name order. Per member:
//
//   presence  1 byte        1: this rank sent the member's payload, 0: the
//                           member left the batch here (then length is 0)
//   length    8 bytes       the payload's size, little-endian
//   payload   length bytes
//
// and nothing after the last member. Peers send it, so SplitGatherMessage
// treats it as hostile input (service/collective/fuzz checks it).
//
//   codecs::Bytes message = GatherMessage(payloads, arrived);
//   std::vector<std::optional<codecs::Bytes>> split(members);
//   GC_RETURN_IF_ERROR(SplitGatherMessage(message, rank, &split));
#ifndef GRADCOMP_SERVICE_COLLECTIVE_GATHER_BATCH_MESSAGE_H_
#define GRADCOMP_SERVICE_COLLECTIVE_GATHER_BATCH_MESSAGE_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "codecs/tensor.h"

namespace gradcomp::service {

// Bytes before each member's payload: presence and length.
inline constexpr size_t kGatherEntryHeader = 1 + sizeof(uint64_t);

// The message holding `payloads[i]` for each member i with `arrived[i]`, and
// an absent entry for the others. The two vectors have one slot per member.
codecs::Bytes GatherMessage(const std::vector<codecs::Bytes>& payloads,
                            const std::vector<bool>& arrived);

// Splits rank `rank`'s GATHER batch message into `out` (one slot per
// member; a member it left out stays as it was, nullopt for a fresh
// vector). InvalidArgument naming the rank when the message does not hold
// exactly one well-formed entry per member.
absl::Status SplitGatherMessage(const codecs::Bytes& message, int rank,
                                std::vector<std::optional<codecs::Bytes>>* out);

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_COLLECTIVE_GATHER_BATCH_MESSAGE_H_
