// `threshold`: gradient dropping (Aji & Heafield, EMNLP 2017; "Sparse
// Communication for Distributed Gradient Descent"). Each worker adds its
// gradient to what it has not sent yet, sends the entries with |v| >= tau as
// (index, value) pairs and keeps the rest: a threshold sparsifier inside the
// ErrorFeedback decorator, which holds the accumulation ("ef.residual").
//
//   GC_ASSIGN_OR_RETURN(auto codec, registry.Create("threshold", CodecParams(
//                           {{"tau", "0.001"}})));      // absolute
//   // or {{"tau_rms", "2.5"}}: tau = 2.5 * RMS of the accumulated v
//
// `tau` (> 0) is an absolute threshold: after every step each residual
// |e_i| < tau. Absolute thresholds need the gradient's scale, which changes
// by orders of magnitude across layers and training, so the default is the
// relative `tau_rms` = 2.5: tau = 2.5 * sqrt(sum v^2 / n) (about 1.2 % of a
// Gaussian's entries), clamped to max |v| so that at least the largest entry
// goes (else a tensor with n <= tau_rms^2 entries would never send). Give at
// most one of the two.
// Payload: sparse_payload.h, with codec id kThreshold.
#ifndef GRADCOMP_CODECS_CPU_THRESHOLD_H_
#define GRADCOMP_CODECS_CPU_THRESHOLD_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "codecs/codec.h"
#include "codecs/params.h"
#include "codecs/registry.h"

namespace gradcomp::codecs {

struct ThresholdOptions {
  // Exactly one is > 0.
  double tau = 0;        // absolute threshold
  double tau_rms = 2.5;  // threshold relative to the RMS of v
};

// The sparsifier alone, without accumulation: sends {i : |v_i| >= tau}.
// RegisterThreshold wraps it in ErrorFeedback.
class ThresholdSparsifier : public SingleRoundCodec {
 public:
  // Parses and checks "tau" and "tau_rms"; rejects unknown names.
  static absl::StatusOr<ThresholdOptions> ParseOptions(
      const CodecParams& params);

  explicit ThresholdSparsifier(const ThresholdOptions& options);

  const CodecInfo& info() const override { return info_; }

  // InvalidArgument if the tensor has 2^32 elements or more (uint32
  // indices), or if v holds NaN or Inf (with either threshold).
  absl::Status Encode(const TensorView& grad, TensorState& state,
                      const StepContext& ctx, Bytes* payload) const override;

  absl::Status DecodeAdd(absl::string_view payload, float alpha,
                         absl::Span<float> acc) const override;

  // The threshold Encode applies to `v`.
  float TauFor(absl::Span<const float> v) const;

 private:
  ThresholdOptions options_;
  CodecInfo info_;
};

// The info "threshold" registers: with accumulation, so stateful and biased.
CodecInfo ThresholdInfo();

// Registers "threshold" (ErrorFeedback around ThresholdSparsifier).
absl::Status RegisterThreshold(CodecRegistry& registry);

}  // namespace gradcomp::codecs

#endif  // GRADCOMP_CODECS_CPU_THRESHOLD_H_
