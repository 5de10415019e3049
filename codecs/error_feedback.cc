#include "codecs/error_feedback.h"

#include <cmath>
#include <limits>
#include <utility>

namespace gradcomp::codecs {

ErrorFeedback::ErrorFeedback(std::unique_ptr<SingleRoundCodec> inner)
    : inner_(std::move(inner)), info_(inner_->info()) {
  info_.stateful = true;
  info_.unbiased = false;
}

absl::Status ErrorFeedback::Encode(const TensorView& grad, TensorState& state,
                                   const StepContext& ctx,
                                   Bytes* payload) const {
  const size_t n = grad.numel();
  // The residual buffer itself holds p = g + e and then becomes
  // p - D(payload): no per-step scratch tensor, whose fresh pages would cost
  // more than the arithmetic on large tensors.
  absl::Span<float> p = state.Buffer(kErrorFeedbackBuffer, n);
  for (size_t i = 0; i < n; ++i) p[i] += grad.values[i];
  absl::Status status =
      inner_->Encode(TensorView{p, grad.shape}, state, ctx, payload);
  if (status.ok()) status = inner_->DecodeAdd(*payload, -1.0f, p);
  if (!status.ok()) {
    // Give the residual back (to within rounding) so that a failed step
    // neither loses nor double-counts the carried error. Where g + e is not
    // finite (an overflow, or a NaN or Inf that the inner codec refused),
    // e cannot be had back: it restarts from zero there, or Inf - Inf would
    // leave a NaN that fails every later step. Checked on this path only:
    // a check in the sum above cost efsign's encode 12 %, and every inner
    // codec refuses a non-finite input it would send.
    for (size_t i = 0; i < n; ++i) {
      const float e = p[i] - grad.values[i];
      p[i] = std::fabs(e) <= std::numeric_limits<float>::max() ? e : 0.0f;
    }
  }
  return status;
}

absl::Status ErrorFeedback::DecodeAdd(absl::string_view payload, float alpha,
                                      absl::Span<float> acc) const {
  return inner_->DecodeAdd(payload, alpha, acc);
}

absl::Status ErrorFeedback::FinishSum(absl::Span<const float> sum,
                                      int world_size, const StepContext& ctx,
                                      absl::Span<float> out) const {
  return inner_->FinishSum(sum, world_size, ctx, out);
}

absl::Status ErrorFeedback::FinishGather(absl::Span<const Bytes> payloads,
                                         const StepContext& ctx,
                                         absl::Span<float> out) const {
  return inner_->FinishGather(payloads, ctx, out);
}

}  // namespace gradcomp::codecs
