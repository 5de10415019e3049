// The (index, value) payload of the sparse codecs: a count, the strictly
// ascending indices gap-coded (index_coding.h), then the fp32 values. One
// writer and one checking reader, so that every sparse codec validates the
// same way.
//
//   WriteSparsePayload(CodecId::kThreshold, n, indices, values, &payload);
//   GC_RETURN_IF_ERROR(AddSparsePayload(payload, CodecId::kThreshold,
//                                       "threshold", alpha, acc));
//
// Parameters are 8 bytes: [0] index coding (1 = gaps bit-packed per block),
// [1..3] zero, [4..7] uint32 count c; the body is the c coded indices, then
// c fp32 values (the layout topk uses).
#ifndef GRADCOMP_CODECS_CPU_SPARSE_PAYLOAD_H_
#define GRADCOMP_CODECS_CPU_SPARSE_PAYLOAD_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "codecs/tensor.h"
#include "codecs/wire.h"

namespace gradcomp::codecs {

// Writes the payload but its values: header, parameters and the coded
// `indices` (strictly ascending and below numel < 2^32). Returns where the
// indices.size() fp32 values go, for a caller that gathers them in place.
char* BeginSparsePayload(CodecId codec, uint64_t numel,
                         absl::Span<const uint32_t> indices, Bytes* out);

// BeginSparsePayload, then `values` (values.size() == indices.size(), all
// finite: ParseSparsePayload refuses NaN and Inf).
void WriteSparsePayload(CodecId codec, uint64_t numel,
                        absl::Span<const uint32_t> indices,
                        absl::Span<const float> values, Bytes* out);

// A payload's (index, value) pairs, every part checked.
struct SparsePairs {
  std::vector<uint32_t> indices;  // strictly ascending, below numel
  absl::string_view values;       // indices.size() fp32 values, unaligned

  // The value of pair j.
  float value(size_t j) const {
    float v;
    std::memcpy(&v, values.data() + sizeof(float) * j, sizeof(v));
    return v;
  }
};

// Checks the whole payload: the header for `codec` and `numel` elements, the
// parameters, every index, the length and that every value is finite.
// InvalidArgument, prefixed with `name`.
absl::StatusOr<SparsePairs> ParseSparsePayload(absl::string_view payload,
                                               CodecId codec,
                                               absl::string_view name,
                                               uint64_t numel);

// acc[index] += alpha * value for each pair, in order.
void AddSparsePairs(const SparsePairs& pairs, float alpha,
                    absl::Span<float> acc);

// ParseSparsePayload for acc.size() elements, and only then AddSparsePairs.
// An error leaves `acc` untouched.
absl::Status AddSparsePayload(absl::string_view payload, CodecId codec,
                              absl::string_view name, float alpha,
                              absl::Span<float> acc);

}  // namespace gradcomp::codecs

#endif  // GRADCOMP_CODECS_CPU_SPARSE_PAYLOAD_H_
