// Checks the parsers of what a peer daemon sends, on arbitrary bytes. The
// first byte picks the parser (modulo kCount), the second its parameter,
// the rest is the message:
//   kFrame: ParseFrame (service/transport/peer_frame.h) on a gRPC buffer of
//     two slices, the message cut where the second byte says (modulo its
//     length + 1), as the network may cut it;
//   kGatherBatch: SplitGatherMessage (gather_batch_message.h) for a batch
//     of 1 + (second byte % 64) members.
// Each must end in OK or InvalidArgument with a message, never a crash. What
// parses must survive being written again: a frame's chunk lies inside the
// buffer's slices and DataFrame/HelloFrame write the same fields back, and
// GatherMessage writes a split batch message's bytes back exactly. Used by
// peer_message_fuzzer (libFuzzer) and peer_message_corpus_test (gcc).
//
//   CheckPeerMessage(data, size);  // aborts with "peer_message_fuzzer: ..."
//                                  // on a broken promise
#ifndef GRADCOMP_SERVICE_COLLECTIVE_FUZZ_PEER_MESSAGE_CHECKER_H_
#define GRADCOMP_SERVICE_COLLECTIVE_FUZZ_PEER_MESSAGE_CHECKER_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

namespace gradcomp::service {

// The parser an input's first byte selects (modulo the count).
enum class PeerParser : uint8_t {
  kFrame = 0,
  kGatherBatch = 1,
  kCount = 2,
};

// The rank a fuzzed batch message comes from; its errors must name it.
inline constexpr int kFuzzedRank = 5;

// The parser's status (InvalidArgument also for an input under 2 bytes).
absl::Status CheckPeerMessage(const uint8_t* data, size_t size);

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_COLLECTIVE_FUZZ_PEER_MESSAGE_CHECKER_H_
