// The bytes one rank sends a neighbour in one gossip step, and their
// checked parsing: a receiver refuses a message whose kind, rank, tensor
// shape, power step or length differ from what its own end of the edge
// expects, so two ends that drifted apart (another policy or shape) fail
// loudly instead of mixing unrelated numbers. (PowerGossip reads the header
// first and starts an edge whose ends ran different power steps again;
// power_gossip.h.)
// Little-endian:
//
//   offset  size  field
//        0     4  magic "GOSP"
//        4     1  version (2)
//        5     1  kind: 1 plain (the whole tensor), 2 X input (rows x r),
//                 3 X^T input (cols x r), 4 sparse (Choco-Gossip's top-k)
//        6     2  reserved, 0
//        8     4  r (0 for plain)
//       12     4  shape hash (GossipShapeHash of the tensor's shape)
//       16     8  power step on this edge (1-based; 0 for plain)
//       24     8  value count n
//       32    4n  fp32 values
//
// A sparse message (kind 4, r 0, the edge's Choco step) holds n uint32
// indices, strictly increasing and below the tensor's size, then their n
// fp32 values: 32 + 8n bytes.
//
//   WriteGossipMessage(header, values, &bytes);
//   GC_RETURN_IF_ERROR(ReadGossipMessage(bytes, expected, absl::MakeSpan(v)));
#ifndef GRADCOMP_SERVICE_GOSSIP_GOSSIP_MESSAGE_H_
#define GRADCOMP_SERVICE_GOSSIP_GOSSIP_MESSAGE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "codecs/tensor.h"

namespace gradcomp::service {

inline constexpr size_t kGossipHeaderBytes = 32;

enum class GossipKind : uint8_t {
  kPlain = 1,
  kLeft = 2,
  kRight = 3,
  kSparse = 4
};

struct GossipMessageHeader {
  GossipKind kind = GossipKind::kPlain;
  uint32_t rank = 0;
  uint64_t power_step = 0;
  uint64_t count = 0;
  uint32_t shape_hash = 0;
};

// The CRC-32C of `shape`'s dimensions as little-endian int64s: two ends of
// an edge whose tensors have the same element count, and even the same
// rows, but another shape ([6,5] and [5,6]; [6,5] and [6,4], whose
// left-step messages are both 6 x r) would otherwise mix their numbers.
uint32_t GossipShapeHash(absl::Span<const int64_t> shape);

void WriteGossipMessage(const GossipMessageHeader& header,
                        absl::Span<const float> values, codecs::Bytes* out);

// The header of `bytes` as sent, after checking its length, magic, version
// and reserved bytes only (`kind` may be a value no GossipKind names):
// what a receiver reads to tell an edge out of step from a bad message.
absl::StatusOr<GossipMessageHeader> ReadGossipHeader(absl::string_view bytes);

// Checks `bytes` completely against `expected` and copies its values into
// `out` (expected.count values). InvalidArgument saying what came and what
// was expected otherwise; `out` is then untouched.
absl::Status ReadGossipMessage(absl::string_view bytes,
                               const GossipMessageHeader& expected,
                               absl::Span<float> out);

// A sparse message: header.kind must be kSparse; `indices` and `values` have
// the same length, which the header's count is set to.
void WriteSparseGossipMessage(const GossipMessageHeader& header,
                              absl::Span<const uint32_t> indices,
                              absl::Span<const float> values,
                              codecs::Bytes* out);

// Checks a sparse message completely against `expected` (kind, step and
// count) and its indices against `size` (strictly increasing, below it),
// then copies them into `indices` and `values` (expected.count each).
// InvalidArgument otherwise; the outputs are then untouched.
absl::Status ReadSparseGossipMessage(absl::string_view bytes,
                                     const GossipMessageHeader& expected,
                                     uint64_t size,
                                     absl::Span<uint32_t> indices,
                                     absl::Span<float> values);

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_GOSSIP_GOSSIP_MESSAGE_H_
