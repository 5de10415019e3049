// `randomk`: random-k sparsification. Every rank draws the same k = ceil(ratio
// * n) indices from a Philox stream keyed by (seed, tensor, step), so only the
// k values travel and payloads add up as they are (a SUM collective).
//
//   GC_ASSIGN_OR_RETURN(auto codec, registry.Create("randomk", CodecParams(
//                           {{"ratio", "0.01"}})));  // scaled, unbiased
//   // {"error_feedback", "true"}: unscaled, residual kept in the state.
//
// `scale` (default true) multiplies the values by n / k, which makes the
// estimate unbiased. `error_feedback` (default false) wraps the codec in the
// ErrorFeedback decorator; it defaults `scale` to false and rejects
// scale=true, because the scaled error p - (n/k) p_S is larger than p itself
// and the residual would grow without bound (Stich et al. 2018 use the
// unscaled operator with memory).
//
// Index draw (docs/wire-format.md pins it): m = min(k, n - k) indices by
// Floyd's algorithm, for t = 0..m-1: j = n - m + t, r = floor(w_t * (j + 1) /
// 2^64) with w_t the 64-bit word t of the stream (word t % 4 of block t / 4);
// mark r unless it is marked already, then mark j. When m = n - k the marked
// set is the complement. O(m) draws plus one scan of an n-bit bitmap, sorted
// output, every k-subset equally likely (up to the 2^-64 bias of the
// multiply-shift).
#ifndef GRADCOMP_CODECS_CPU_RANDOMK_H_
#define GRADCOMP_CODECS_CPU_RANDOMK_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "codecs/codec.h"
#include "codecs/params.h"
#include "codecs/random.h"
#include "codecs/registry.h"

namespace gradcomp::codecs {

struct RandomKOptions {
  double ratio = 0.01;  // k / n, in (0, 1]
  bool scale = true;    // multiply by n / k (unbiased)
};

// A bitmap of ceil(n / 64) words with exactly k of the bits [0, n) set, drawn
// as the header describes. k <= n.
std::vector<uint64_t> DrawRandomKBitmap(uint64_t n, uint64_t k,
                                        const PhiloxStream& rng);

class RandomKCodec : public SingleRoundCodec {
 public:
  // Parses "ratio" and "scale" only; "error_feedback" belongs to the
  // registration (RegisterRandomK), which wraps this codec.
  static absl::StatusOr<RandomKOptions> ParseOptions(const CodecParams& params,
                                                     bool error_feedback);

  explicit RandomKCodec(const RandomKOptions& options);

  const CodecInfo& info() const override { return info_; }

  // InvalidArgument when a value it would send is NaN or Inf (g holds one,
  // or g times n / k overflowed): no decoder accepts one.
  absl::Status Encode(const TensorView& grad, TensorState& state,
                      const StepContext& ctx, Bytes* payload) const override;

  // Draws the indices again from the key in the payload's parameters.
  absl::Status DecodeAdd(absl::string_view payload, float alpha,
                         absl::Span<float> acc) const override;

  // Scatters sum / W to this step's indices (drawn from `ctx`), zero
  // elsewhere.
  absl::Status FinishSum(absl::Span<const float> sum, int world_size,
                         const StepContext& ctx,
                         absl::Span<float> out) const override;

  // k = ceil(ratio * n), at least 1 for a nonempty tensor.
  uint64_t KFor(uint64_t numel) const;

  // The factor of the values sent: n / k with `scale`, else 1.
  float ScaleFor(uint64_t numel) const;

  const RandomKOptions& options() const { return options_; }

 private:
  RandomKOptions options_;
  CodecInfo info_;
};

CodecInfo RandomKInfo();

// The stream a step's indices are drawn from: (seed, tensor, step, round 0).
PhiloxStream RandomKStream(const StepContext& ctx);

// Writes the header and parameter block of the randomk payload of step `ctx`
// for a tensor of n elements with k values (the key that lets a decoder draw
// the indices again) and returns its body: k fp32, unaligned, for the caller
// to fill in ascending index order. Every backend's encoder writes these
// bytes (codecs/cuda too).
char* BeginRandomKPayload(uint64_t n, uint64_t k, const StepContext& ctx,
                          Bytes* payload);

// Encode's error for the value it would send for element `index` (g[index]
// times `scale`), which is NaN or Inf; the GPU encoder's too.
absl::Status RandomKNonFiniteValue(uint64_t index, float value, float scale);

// A randomk payload for a tensor of n elements, checked as DecodeAdd checks
// it (the GPU decoder's checks too): every length, and every value finite.
struct RandomKPayload {
  uint64_t k = 0;    // <= n
  PhiloxStream rng;  // the key of the draw: DrawRandomKBitmap(n, k, rng)
  absl::string_view values;  // k fp32, unaligned, in ascending index order
};
absl::StatusOr<RandomKPayload> ParseRandomKPayload(absl::string_view payload,
                                                   uint64_t n);

// Registers "randomk" (params ratio, scale, error_feedback).
absl::Status RegisterRandomK(CodecRegistry& registry);

}  // namespace gradcomp::codecs

#endif  // GRADCOMP_CODECS_CPU_RANDOMK_H_
