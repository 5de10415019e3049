#include "codecs/testing/rounding_codec.h"

#include <cmath>
#include <vector>

#include "base/status_macros.h"
#include "codecs/wire.h"

namespace gradcomp::codecs::testing {

RoundingCodec::RoundingCodec(float step, bool summable) : step_(step) {
  info_.name = summable ? "rounding_sum" : "rounding_gather";
  // An id of a codec that is not dense, so that tests see codec checks work.
  info_.id = CodecId::kInt8;
  info_.family = "test";
  info_.summable = summable;
}

absl::Status RoundingCodec::Encode(const TensorView& grad,
                                   TensorState& /*state*/,
                                   const StepContext& /*ctx*/,
                                   Bytes* payload) const {
  std::vector<float> rounded(grad.numel());
  for (size_t i = 0; i < rounded.size(); ++i) {
    rounded[i] = std::round(grad.values[i] / step_) * step_;
  }
  WireHeader header;
  header.codec = info_.id;
  header.numel = rounded.size();
  WriteDensePayload(header, ElemType::kF32, rounded, payload);
  return absl::OkStatus();
}

absl::Status RoundingCodec::DecodeAdd(absl::string_view payload, float alpha,
                                      absl::Span<float> acc) const {
  GC_ASSIGN_OR_RETURN(ParsedPayload parsed,
                      ParsePayload(payload, info_.id, 0, acc.size()));
  return AddDenseBody(parsed, alpha, acc);
}

}  // namespace gradcomp::codecs::testing
