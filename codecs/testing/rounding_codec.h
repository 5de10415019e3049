// A deliberately lossy codec for tests of the codec machinery (sessions,
// decorators, collectives): it rounds every value to a multiple of `step`
// and sends the result as a dense fp32 body. Summable or not, as asked.
//
//   RoundingCodec codec(/*step=*/0.5f, /*summable=*/false);
#ifndef GRADCOMP_CODECS_TESTING_ROUNDING_CODEC_H_
#define GRADCOMP_CODECS_TESTING_ROUNDING_CODEC_H_

#include "codecs/codec.h"

namespace gradcomp::codecs::testing {

class RoundingCodec : public SingleRoundCodec {
 public:
  RoundingCodec(float step, bool summable);

  const CodecInfo& info() const override { return info_; }
  absl::Status Encode(const TensorView& grad, TensorState& state,
                      const StepContext& ctx, Bytes* payload) const override;
  absl::Status DecodeAdd(absl::string_view payload, float alpha,
                         absl::Span<float> acc) const override;

 private:
  float step_;
  CodecInfo info_;
};

}  // namespace gradcomp::codecs::testing

#endif  // GRADCOMP_CODECS_TESTING_ROUNDING_CODEC_H_
