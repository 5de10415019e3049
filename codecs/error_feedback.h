// Error feedback (Seide et al. 2014; Karimireddy et al. 2019) as a decorator:
// wraps any single-round codec C and keeps the compression error in the
// tensor's state, adding it to the next step's gradient.
//
//   p = g + e;  payload = C(p);  e <- p - D(payload)
//
//   auto ef = std::make_unique<ErrorFeedback>(std::move(topk));
//   // ef is a SingleRoundCodec: register it, or Start() sessions with it.
//
// The residual lives in the TensorState buffer "ef.residual" (numel floats).
#ifndef GRADCOMP_CODECS_ERROR_FEEDBACK_H_
#define GRADCOMP_CODECS_ERROR_FEEDBACK_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "codecs/codec.h"

namespace gradcomp::codecs {

inline constexpr absl::string_view kErrorFeedbackBuffer = "ef.residual";

class ErrorFeedback : public SingleRoundCodec {
 public:
  // The decorated codec's info, marked stateful and biased: the output of
  // one step is not an unbiased estimate of that step's gradient.
  explicit ErrorFeedback(std::unique_ptr<SingleRoundCodec> inner);

  const CodecInfo& info() const override { return info_; }
  const SingleRoundCodec& inner() const { return *inner_; }

  // When it fails, the residual is left as it was to within rounding, and
  // finite: an entry whose g + e is not finite restarts from zero.
  absl::Status Encode(const TensorView& grad, TensorState& state,
                      const StepContext& ctx, Bytes* payload) const override;
  // e = (p - D(payload)) + D(payload) - g, after the inner codec's Revert.
  void Revert(const TensorView& grad, TensorState& state,
              const StepContext& ctx, absl::string_view payload) const override;
  absl::Status DecodeAdd(absl::string_view payload, float alpha,
                         absl::Span<float> acc) const override;
  absl::Status FinishSum(absl::Span<const float> sum, int world_size,
                         const StepContext& ctx,
                         absl::Span<float> out) const override;
  bool FinishSumInPlace() const override { return inner_->FinishSumInPlace(); }
  absl::Status FinishGather(absl::Span<const Bytes> payloads,
                            const StepContext& ctx,
                            absl::Span<float> out) const override;

 private:
  std::unique_ptr<SingleRoundCodec> inner_;
  CodecInfo info_;
};

}  // namespace gradcomp::codecs

#endif  // GRADCOMP_CODECS_ERROR_FEEDBACK_H_
