// `qsgd`: Quantized SGD (Alistarh et al., NeurIPS 2017). Per bucket of d
// values with L2 norm ||v||, each value becomes ||v|| * sign * level / s with
// level in [0, s] rounded stochastically so that E[Q(v)] = v and
// E||Q(v) - v||^2 <= min(d / s^2, sqrt(d) / s) * ||v||^2.
//
//   GC_ASSIGN_OR_RETURN(auto codec, QsgdCodec::Create(CodecParams(
//                           {{"bits", "4"}, {"bucket", "512"}})));
//
// `bits` b in [2, 8] is the size of one value on the wire: a sign bit and
// b - 1 level bits, so s = 2^(b-1) - 1 levels (b = 4: s = 7).
// Rounding draws Uniform(i) for element i from this worker's Philox stream
// (kernels.h WorkerStream, round 0): level = min(s, floor(|v_i| * (s / ||v||)
// + u_i)) in fp32, the same bytes on every backend for one seed.
// Payload (after the wire header, little-endian): parameters are 8 bytes,
// [0..3] uint32 bucket d, [4] uint8 bits b, [5..7] zero; the body is
// ceil(n / d) fp32 norms, then ceil(n * b / 8) bytes of codes, code i in
// bits [i*b, (i+1)*b) counted from the least significant bit of byte 0,
// code = level | sign << (b - 1); padding bits are zero.
#ifndef GRADCOMP_CODECS_CPU_QSGD_H_
#define GRADCOMP_CODECS_CPU_QSGD_H_

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

struct QsgdOptions {
  int64_t bucket = 512;  // d, in [1, 2^20]
  int bits = 4;          // b, in [2, 8]
  int levels() const { return (1 << (bits - 1)) - 1; }
};

class QsgdCodec : public SingleRoundCodec {
 public:
  // Parses and checks "bucket" and "bits"; rejects unknown names.
  static absl::StatusOr<std::unique_ptr<QsgdCodec>> Create(
      const CodecParams& params);

  explicit QsgdCodec(const QsgdOptions& options);

  const CodecInfo& info() const override { return info_; }

  // InvalidArgument if a bucket's norm is not finite (NaN or Inf in `grad`).
  absl::Status Encode(const TensorView& grad, TensorState& state,
                      const StepContext& ctx, Bytes* payload) const override;

  // Decodes with the bucket and bits the payload names (any valid ones).
  absl::Status DecodeAdd(absl::string_view payload, float alpha,
                         absl::Span<float> acc) const override;

  // The base's mean of the decodes, bit for bit, without its zero-filled
  // scratch: every payload is parsed (checked) first, then decoded into
  // `out`, so a bad one still leaves `out` untouched.
  absl::Status FinishGather(absl::Span<const Bytes> payloads,
                            const StepContext& ctx,
                            absl::Span<float> out) const override;

  const QsgdOptions& options() const { return options_; }

 private:
  QsgdOptions options_;
  CodecInfo info_;
};

CodecInfo QsgdInfo();

// Why an encode fails (CPU and GPU alike): a bucket's norm goes on the wire
// in fp32, so a bucket of finite values whose norm passes FLT_MAX cannot go.
inline constexpr char kQsgdNonFiniteNorm[] =
    "qsgd: a bucket's L2 norm is not finite: the gradient holds NaN or Inf, "
    "or a bucket's norm passes float range (3.4e38); expected finite values "
    "of smaller size";

// A qsgd payload for a tensor of n elements, checked as DecodeAdd checks it
// (the GPU decoder, codecs/cuda, uses the same checks).
struct QsgdPayload {
  size_t bucket = 0;      // d, in [1, 2^20]
  int bits = 0;           // b, in [2, 8]
  size_t buckets = 0;     // ceil(n / d)
  size_t code_bytes = 0;  // ceil(n * b / 8)
  // `buckets` fp32 norms, finite and >= 0, then the codes with zero padding
  // bits; unaligned.
  absl::string_view body;
};
absl::StatusOr<QsgdPayload> ParseQsgdPayload(absl::string_view payload,
                                             size_t n);

// Registers "qsgd".
absl::Status RegisterQsgd(CodecRegistry& registry);

}  // namespace gradcomp::codecs

#endif  // GRADCOMP_CODECS_CPU_QSGD_H_
