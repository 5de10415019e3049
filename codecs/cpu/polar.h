// `polar`: gradients through polar-code lossy source coding (polar_code.h).
// Two modes:
//  - `planes` (default): per bucket, scale by max|g| and quantise |g| to B
//    magnitude bits (no wrap-around); the sign is sent raw, and each
//    magnitude plane p goes raw, polar-coded at rate r/16, or not at all,
//    with rates chosen greedily to minimise the expected MSE
//    sum_p 4^p m_p within `bits_per_value` (sign included; per-bucket scales
//    not). m_p is 0 raw, 1/4 unsent, D(1-D) coded, D the measured distortion
//    of the code at that rate (PolarAllocation). A non-raw plane is
//    reconstructed as r0 / r1 for a decoded 0 / 1: the means of the true
//    bits there, which the encoder measures and sends.
//  - `seed`: the Polarcode-Gradient-Compression seed's scheme, for
//    comparison: int16(trunc(g * 1e5)) wrapping modulo 2^16, the 16 bits of
//    each value (least significant first, value after value) polar-coded at
//    rate 1/2: 8 bits per value.
//
//   GC_ASSIGN_OR_RETURN(auto codec, PolarCodec::Create(CodecParams(
//                           {{"bits_per_value", "4"}})));
//
// Biased and stateless; one kGather round. Payload layout: docs/wire-format.md.
// Through the registry, `error_feedback=true` (planes mode only) wraps the
// codec in the ErrorFeedback decorator (residual "ef.residual"), which
// carries the quantisation and coding error into the next step.
//
// Large tensors are coded on all cores: polar blocks (and element loops) are
// split across threads, and every block's random draws depend on the block
// alone, so a payload's bytes do not depend on the number of threads.
#ifndef GRADCOMP_CODECS_CPU_POLAR_H_
#define GRADCOMP_CODECS_CPU_POLAR_H_

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

enum class PolarMode : uint8_t { kPlanes = 1, kSeed = 2 };

struct PolarOptions {
  PolarMode mode = PolarMode::kPlanes;
  double bits_per_value = 4.0;  // planes: sign + planes, in [1, 1 + B]
  int64_t bucket = 512;         // planes: values per scale, in [1, 2^20]
  int magnitude_bits = 8;       // planes: B, in [1, 15]
  int log2_block = 11;          // polar block length N = 2^log2_block, [4, 16]
  int draws = 4;                // SC encodings per block, best kept, [1, 16]
};

// Rate codes r in [0, 16] (rate r / 16) per magnitude plane, index p = 0 the
// least significant, for B = rates.size() planes: the greedy allocation of
// `plane_bits` bits per value (bits_per_value - 1) by the largest MSE drop
// per bit, using the distortion of PolarCode at N = 2048 measured by
// //codecs/cpu:polar_rate_distortion_tool.
std::vector<int> PolarAllocation(int magnitude_bits, double plane_bits);

class PolarCodec : public SingleRoundCodec {
 public:
  // Parses "mode" (planes | seed), "bits_per_value", "bucket",
  // "magnitude_bits", "log2_block", "draws"; rejects unknown names.
  // "error_feedback" belongs to the registration (RegisterPolar), which
  // wraps this codec.
  static absl::StatusOr<std::unique_ptr<PolarCodec>> Create(
      const CodecParams& params);

  explicit PolarCodec(const PolarOptions& options);

  const CodecInfo& info() const override { return info_; }
  const PolarOptions& options() const { return options_; }

  // InvalidArgument if `grad` holds NaN or Inf.
  absl::Status Encode(const TensorView& grad, TensorState& state,
                      const StepContext& ctx, Bytes* payload) const override;

  // Decodes any valid payload, whatever the mode and rates it names.
  absl::Status DecodeAdd(absl::string_view payload, float alpha,
                         absl::Span<float> acc) const override;

 private:
  PolarOptions options_;
  CodecInfo info_;
};

CodecInfo PolarInfo();

// Registers "polar" (ErrorFeedback around PolarCodec with
// error_feedback=true).
absl::Status RegisterPolar(CodecRegistry& registry);

}  // namespace gradcomp::codecs

#endif  // GRADCOMP_CODECS_CPU_POLAR_H_
