// `onebit`: 1-bit SGD (Seide et al., Interspeech 2014). Each value becomes
// one bit, reconstructed as its column's mean of the non-negative values or
// of the negative values; the quantisation error is fed back into the next
// step (ErrorFeedback decorator), which is what makes one bit enough.
//
//   GC_ASSIGN_OR_RETURN(auto codec, BuiltinCodecs().Create("onebit", {}));
//
// Columns: the tensor is seen as the matrix [shape[0], n / shape[0]] and
// quantised per column (element i is in column i mod c, c = n / shape[0]),
// Seide's per-column quantisation of a weight matrix: for a Linear weight
// [out, in] a column holds one input's weights to every output. A 1-D tensor
// is one column. Each column costs 64 bits, so a value costs 1 + 64 / shape[0]
// bits: tensors with few rows pay more.
// Signs: x >= 0 (and zero) is the non-negative side (bitpack.h).
// Payload (after the wire header, little-endian): parameters are 8 bytes,
// u64 column count c (0 when n is 0, else a divisor of n); body = c f32
// means of the non-negative part, c f32 means of the negative part (0 for an
// empty side), then SignBytes(n) bytes of packed signs.
#ifndef GRADCOMP_CODECS_CPU_ONEBIT_H_
#define GRADCOMP_CODECS_CPU_ONEBIT_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "codecs/codec.h"
#include "codecs/params.h"
#include "codecs/registry.h"

namespace gradcomp::codecs {

// The quantiser alone, without error feedback; the registered "onebit" is
// ErrorFeedback(OneBitCodec).
class OneBitCodec : public SingleRoundCodec {
 public:
  // Rejects every parameter (onebit has none); the codec comes wrapped in
  // ErrorFeedback.
  static absl::StatusOr<std::unique_ptr<SingleRoundCodec>> Create(
      const CodecParams& params);

  OneBitCodec();

  const CodecInfo& info() const override { return info_; }

  // InvalidArgument if shape[0] does not divide numel, or if `grad` holds
  // NaN or Inf (a column's mean is then not finite).
  absl::Status Encode(const TensorView& grad, TensorState& state,
                      const StepContext& ctx, Bytes* payload) const override;

  absl::Status DecodeAdd(absl::string_view payload, float alpha,
                         absl::Span<float> acc) const override;

 private:
  CodecInfo info_;
};

CodecInfo OneBitInfo();

// The column count of a tensor of n elements whose shape[0] is `rows`:
// n / rows (0 when n is 0); InvalidArgument unless rows divides n.
absl::StatusOr<size_t> OneBitColumns(size_t n, int64_t rows);

// A column's mean of one side: sum / count, 0 for an empty side.
float OneBitMean(double sum, double count);

// Writes the header and parameter block of the onebit payload of n elements
// in `columns` columns and returns its body (OneBitPayload's layout: 2 *
// columns fp32 means, then SignBytes(n) bytes of signs) for the caller to
// fill. Every backend's encoder writes these bytes (codecs/cuda too).
char* BeginOneBitPayload(size_t n, size_t columns, Bytes* payload);

// A onebit payload for a tensor of n elements, checked as DecodeAdd checks
// it (the GPU decoder's checks too).
struct OneBitPayload {
  size_t columns = 0;
  // 2 * columns fp32, unaligned: the non-negative side's means (finite,
  // >= 0), then the negative side's (finite, <= 0).
  absl::string_view means;
  absl::string_view signs;  // SignBytes(n) bytes, padding bits zero
};
absl::StatusOr<OneBitPayload> ParseOneBitPayload(absl::string_view payload,
                                                 size_t n);

// Registers "onebit".
absl::Status RegisterOneBit(CodecRegistry& registry);

}  // namespace gradcomp::codecs

#endif  // GRADCOMP_CODECS_CPU_ONEBIT_H_
