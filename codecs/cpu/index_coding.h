// Compact coding of a strictly ascending set of tensor indices (a sparse
// payload's coordinates): gaps between neighbours, bit-packed per block of
// 128 at the block's own width. At a density of 1e-3 an index takes 11-14
// bits instead of 32.
//
//   IndexPlan plan = PlanIndices(indices);
//   EncodeIndices(indices, plan, out);   // plan.bytes bytes
//   GC_ASSIGN_OR_RETURN(size_t used, DecodeIndices(in, count, numel, &idx));
//
// Layout: ceil(c / 128) width bytes w_b (0..32), then per block its gaps
// g_j = i_j - i_{j-1} - 1 (i_{-1} = -1), w_b bits each, least significant
// bit first, the block padded with zero bits to a whole byte.
#ifndef GRADCOMP_CODECS_CPU_INDEX_CODING_H_
#define GRADCOMP_CODECS_CPU_INDEX_CODING_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace gradcomp::codecs {

inline constexpr size_t kIndexBlock = 128;

struct IndexPlan {
  std::vector<uint8_t> widths;  // per block
  size_t bytes = 0;             // of the whole encoding
};

// `indices` must be strictly ascending.
IndexPlan PlanIndices(absl::Span<const uint32_t> indices);

// Writes plan.bytes bytes to `out`.
void EncodeIndices(absl::Span<const uint32_t> indices, const IndexPlan& plan,
                   char* out);

// Decodes `count` indices from the front of `in` into `out`, checking every
// width, length, padding bit and that every index is below `numel`; returns
// the bytes used. InvalidArgument on any violation, `out` then unspecified.
absl::StatusOr<size_t> DecodeIndices(absl::string_view in, size_t count,
                                     uint64_t numel,
                                     std::vector<uint32_t>* out);

}  // namespace gradcomp::codecs

#endif  // GRADCOMP_CODECS_CPU_INDEX_CODING_H_
