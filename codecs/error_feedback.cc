#include "codecs/error_feedback.h"

#include <algorithm>
#include <utility>

namespace gradcomp::codecs {

namespace {

// p = g + e back to e, to within rounding. Where g + e is not finite (an
// overflow, or a NaN or Inf that the inner codec refused), e cannot be had
// back: it restarts from zero there, or Inf - Inf would leave a NaN that
// fails every later step. Checked on the failure path only: a check in
// Encode's sum cost efsign's encode 12 %, and every inner codec refuses a
// non-finite input it would send.
void GiveBack(absl::Span<const float> g, absl::Span<float> p) {
  for (size_t i = 0; i < p.size(); ++i) p[i] = FiniteOrZero(p[i] - g[i]);
}

}  // namespace

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
  // A failed step neither loses nor double-counts the carried error.
  if (!status.ok()) GiveBack(grad.values, p);
  return status;
}

void ErrorFeedback::Revert(const TensorView& grad, TensorState& state,
                           const StepContext& ctx,
                           absl::string_view payload) const {
  absl::Span<float> p = state.Buffer(kErrorFeedbackBuffer, grad.numel());
  // Encode decoded this payload into the same buffer, so it decodes again.
  if (!inner_->DecodeAdd(payload, 1.0f, p).ok()) {
    std::fill(p.begin(), p.end(), 0.0f);
    return;
  }
  inner_->Revert(TensorView{p, grad.shape}, state, ctx, payload);
  GiveBack(grad.values, p);
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
