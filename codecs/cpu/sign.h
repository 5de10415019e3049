// The sign codecs, one bit per value plus one fp32 magnitude per payload:
//   `signsgd` (Bernstein et al. 2018): sends sign(g); the average is the
//       per-element majority vote sign(sum_r sign(g_r)).
//   `signum` (Bernstein et al. 2018): keeps m <- beta*m + (1 - beta)*g and
//       sends sign(m); majority vote as signsgd.
//   `efsign` (Karimireddy et al. 2019, EF-signSGD): sends the scaled sign
//       ||p||_1/n * sign(p) of p = g + e through the ErrorFeedback decorator;
//       the average is the mean of the workers' decodes.
//
//   GC_ASSIGN_OR_RETURN(auto codec, BuiltinCodecs().Create("signum", params));
//
// Magnitude: each payload carries s = ||x||_1 / n of the vector x it signs.
// efsign's `bucket` d (default 0: the whole tensor, the paper's scale per
// tensor) instead gives each run of d values its own s = ||x_b||_1 / |x_b|,
// d a multiple of 64 in [64, 2^20]: at 32 / d more bits per value, one
// scale no longer spans rows of very different size.
// A payload decodes to s * sign(x); the vote's output is s_bar * v with s_bar
// the mean of the workers' s and v in {-1, 0, +1}: an optimizer applying
// lr * output moves each coordinate by about the size of an average gradient
// coordinate, so a learning rate tuned for dense SGD stays in range (signSGD's
// own unit step is output / s_bar), and a tensor whose gradient is zero
// everywhere gives a zero average (s = 0).
// Signs: x >= 0 (and NaN) counts as +1 (bitpack.h). Ties, possible with an even
// number of workers, give v = 0: no rank's vote breaks them, so all agree.
// One bit has no room for 0: a coordinate that is exactly 0 on every worker
// (an unused embedding row, a dead unit) while others are not votes +1 and
// moves by +s_bar every step. signsgd and signum (no error feedback) drift
// such coordinates; efsign's residual takes the push back. For sparse
// gradients use efsign, or another codec.
// Payload (after the wire header, little-endian): no parameter block; body =
// f32 s, then SignBytes(n) bytes of packed signs (bitpack.h). efsign with
// d > 0: parameters are 8 bytes, [0..3] uint32 d, [4..7] zero; the body is
// ceil(n / d) f32 scales, then the packed signs.
#ifndef GRADCOMP_CODECS_CPU_SIGN_H_
#define GRADCOMP_CODECS_CPU_SIGN_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "codecs/codec.h"
#include "codecs/params.h"
#include "codecs/registry.h"

namespace gradcomp::codecs {

class SignCodec : public SingleRoundCodec {
 public:
  enum class Variant { kSignSgd, kEfSign, kSignum };

  // Signum's momentum buffer (numel floats).
  static constexpr char kMomentumBuffer[] = "signum.m";

  // Parses the variant's parameters ("momentum" in [0, 1) for signum,
  // "bucket" for efsign, none for signsgd) and rejects unknown names. efsign
  // comes wrapped in ErrorFeedback; the others as they are.
  static absl::StatusOr<std::unique_ptr<SingleRoundCodec>> Create(
      Variant variant, const CodecParams& params);

  // `bucket` 0: one scale per payload (the only form signsgd and signum
  // send).
  SignCodec(Variant variant, float momentum, int64_t bucket = 0);

  const CodecInfo& info() const override { return info_; }

  // InvalidArgument if the signed vector holds NaN or Inf (its magnitude
  // is then not finite); signum's momentum then restarts from zero.
  absl::Status Encode(const TensorView& grad, TensorState& state,
                      const StepContext& ctx, Bytes* payload) const override;
  // Signum: m = (m' - (1 - beta) g) / beta, to within rounding.
  void Revert(const TensorView& grad, TensorState& state,
              const StepContext& ctx, absl::string_view payload) const override;

  // Adds alpha * s * sign to `acc`, with the scales and bucket the payload
  // names (efsign decodes either form).
  absl::Status DecodeAdd(absl::string_view payload, float alpha,
                         absl::Span<float> acc) const override;

  // signsgd and signum: the majority vote (above); efsign: the mean.
  absl::Status FinishGather(absl::Span<const Bytes> payloads,
                            const StepContext& ctx,
                            absl::Span<float> out) const override;

 private:
  Variant variant_;
  float momentum_;
  int64_t bucket_;
  CodecInfo info_;
};

CodecInfo SignInfo(SignCodec::Variant variant);

// A payload of sign codec `variant` for a tensor of n elements, checked as
// DecodeAdd checks it (the GPU decoder's checks too).
struct SignPayload {
  size_t bucket = 0;          // 0: scales[0] covers every value
  std::vector<float> scales;  // ceil(n / bucket) (or 1), finite, >= 0
  // As sent: the scales, then SignBytes(n) bytes of packed signs (padding
  // bits zero).
  absl::string_view body;
  const char* signs() const { return body.data() + 4 * scales.size(); }
};
absl::StatusOr<SignPayload> ParseSignPayload(SignCodec::Variant variant,
                                             absl::string_view payload,
                                             size_t n);

// Registers "signsgd", "efsign" and "signum".
absl::Status RegisterSignCodecs(CodecRegistry& registry);

}  // namespace gradcomp::codecs

#endif  // GRADCOMP_CODECS_CPU_SIGN_H_
