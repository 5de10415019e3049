// `terngrad`: ternary gradients (Wen et al., NeurIPS 2017). Per bucket of d
// values with scale s = max |v|, each value becomes s * sign(v) * b with b ~
// Bernoulli(|v| / s), so E[Q(v)] = v; 2 bits per value plus an fp32 scale per
// bucket.
//
//   GC_ASSIGN_OR_RETURN(auto codec, TernGradCodec::Create(CodecParams(
//                           {{"bucket", "512"}, {"clip_sigma", "2.5"}})));
//
// `clip_sigma` c (default 2.5, the paper's; 0 = off) first clips every value
// to [-c sigma, c sigma]; sigma is the tensor's RMS sqrt(sum v^2 / n) (the
// paper's standard deviation about zero: gradients are near zero-mean, and
// the fixed-order SumOfSquares lets other backends match it bit for bit).
// Clipping shrinks s and with it the variance, at the price of a bias on the
// clipped values: only clip_sigma = 0 is declared unbiased.
// `bucket` (default 512, as qsgd) replaces the paper's one scale per layer:
// a scale per bucket costs 32 / d bits per value and keeps one outlier from
// zeroing a whole layer.
// Rounding: b = (u_i < |v'| * (1 / s)), u_i = Uniform(i) of this worker's
// Philox stream (kernels.h WorkerStream, round 0), all in fp32; v' = v
// clipped.
// Payload (after the wire header, little-endian): parameters are 8 bytes,
// [0..3] uint32 bucket d, [4..7] zero; the body is ceil(n / d) fp32 scales,
// then ceil(n / 4) bytes of 2-bit codes, code i in bits [2(i % 4), 2(i % 4)
// + 2) of byte i / 4: 0 = zero, 1 = +s, 2 = -s (3 is invalid); padding bits
// are zero.
#ifndef GRADCOMP_CODECS_CPU_TERNGRAD_H_
#define GRADCOMP_CODECS_CPU_TERNGRAD_H_

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

struct TernGradOptions {
  int64_t bucket = 512;     // d, in [1, 2^20]
  double clip_sigma = 2.5;  // c >= 0; 0 = no clipping
};

class TernGradCodec : public SingleRoundCodec {
 public:
  // Parses and checks "bucket" and "clip_sigma"; rejects unknown names.
  static absl::StatusOr<std::unique_ptr<TernGradCodec>> Create(
      const CodecParams& params);

  explicit TernGradCodec(const TernGradOptions& options);

  const CodecInfo& info() const override { return info_; }

  // InvalidArgument if `grad` holds NaN or Inf.
  absl::Status Encode(const TensorView& grad, TensorState& state,
                      const StepContext& ctx, Bytes* payload) const override;

  // Decodes with the bucket the payload names.
  absl::Status DecodeAdd(absl::string_view payload, float alpha,
                         absl::Span<float> acc) const override;

  const TernGradOptions& options() const { return options_; }

 private:
  TernGradOptions options_;
  CodecInfo info_;
};

CodecInfo TernGradInfo();

// A terngrad payload for a tensor of n elements, checked as DecodeAdd
// checks it (the GPU decoder's checks too).
struct TernGradPayload {
  size_t bucket = 0;   // d, in [1, 2^20]
  size_t buckets = 0;  // ceil(n / d)
  // As sent: `buckets` fp32 scales (unaligned, finite, >= 0), then
  // ceil(n / 4) bytes of codes (no 3, padding bits zero).
  absl::string_view body;
};
absl::StatusOr<TernGradPayload> ParseTernGradPayload(absl::string_view payload,
                                                     size_t n);

// Registers "terngrad".
absl::Status RegisterTernGrad(CodecRegistry& registry);

}  // namespace gradcomp::codecs

#endif  // GRADCOMP_CODECS_CPU_TERNGRAD_H_
