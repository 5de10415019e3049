// `int8`: bucketed max-min quantisation (the "ByteGrad"-like dense 8-bit
// codec). Per bucket of d values it sends the fp32 min and max and one byte
// per value, level q in [0, 255] with value = min + q * (max - min) / 255.
//
//   GC_ASSIGN_OR_RETURN(auto codec, Int8Codec::Create(CodecParams(
//                           {{"bucket", "1024"}, {"stochastic", "true"}})));
//
// `stochastic` false (default): round to nearest, |error| <= (max - min) / 510
// per value, deterministic and slightly biased. True: round up with
// probability equal to the fraction (Uniform(i) of this worker's Philox
// stream, kernels.h WorkerStream, round 0), unbiased.
// The level is computed in fp32 as x = v * r - min * r with r = 255 / (max -
// min) (range in double, so a span wider than FLT_MAX does not overflow), q =
// min(255, floor(max(x, 0) + 0.5)) or min(255, floor(max(x, 0) + u)).
// Payload (after the wire header, little-endian): parameters are 8 bytes,
// [0..3] uint32 bucket d, [4] rounding (0 nearest, 1 stochastic), [5..7] zero;
// the body is ceil(n / d) pairs (fp32 min, fp32 max), then n level bytes.
// Decoding gives min + q * step, step = (max - min) / 255 rounded to fp32 (at
// half scale, ((min / 2) + q * (step / 2)) * 2, when max - min > FLT_MAX).
#ifndef GRADCOMP_CODECS_CPU_INT8_H_
#define GRADCOMP_CODECS_CPU_INT8_H_

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

struct Int8Options {
  int64_t bucket = 1024;  // d, in [1, 2^20]
  bool stochastic = false;
};

class Int8Codec : public SingleRoundCodec {
 public:
  // Parses and checks "bucket" and "stochastic"; rejects unknown names.
  static absl::StatusOr<std::unique_ptr<Int8Codec>> Create(
      const CodecParams& params);

  explicit Int8Codec(const Int8Options& options);

  const CodecInfo& info() const override { return info_; }

  // InvalidArgument if `grad` holds NaN or Inf.
  absl::Status Encode(const TensorView& grad, TensorState& state,
                      const StepContext& ctx, Bytes* payload) const override;

  // Decodes with the bucket the payload names (either rounding).
  absl::Status DecodeAdd(absl::string_view payload, float alpha,
                         absl::Span<float> acc) const override;

  const Int8Options& options() const { return options_; }

 private:
  Int8Options options_;
  CodecInfo info_;
};

CodecInfo Int8Info();

// An int8 payload for a tensor of n elements, checked as DecodeAdd checks it
// (the GPU decoder, codecs/cuda, uses the same checks).
struct Int8Payload {
  size_t bucket = 0;  // d, in [1, 2^20]
  bool stochastic = false;
  size_t buckets = 0;  // ceil(n / d)
  // `buckets` (fp32 min, fp32 max) pairs, finite with min <= max, then n
  // level bytes; unaligned.
  absl::string_view body;
};
absl::StatusOr<Int8Payload> ParseInt8Payload(absl::string_view payload,
                                             size_t n);

// Registers "int8".
absl::Status RegisterInt8(CodecRegistry& registry);

}  // namespace gradcomp::codecs

#endif  // GRADCOMP_CODECS_CPU_INT8_H_
