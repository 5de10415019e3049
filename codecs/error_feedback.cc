#include "codecs/error_feedback.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "base/status_macros.h"

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
  absl::Span<float> residual = state.Buffer(kErrorFeedbackBuffer, n);
  // p = g + e; after the encode the same vector becomes p - D(payload).
  std::vector<float> corrected(n);
  for (size_t i = 0; i < n; ++i) corrected[i] = grad.values[i] + residual[i];
  TensorView p{absl::MakeConstSpan(corrected), grad.shape};
  GC_RETURN_IF_ERROR(inner_->Encode(p, state, ctx, payload));
  // The residual changes only once the payload decoded, so an error leaves
  // it as it was.
  GC_RETURN_IF_ERROR(
      inner_->DecodeAdd(*payload, -1.0f, absl::MakeSpan(corrected)));
  std::copy(corrected.begin(), corrected.end(), residual.begin());
  return absl::OkStatus();
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
