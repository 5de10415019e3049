// `topk`: Deep Gradient Compression (Lin et al., ICLR 2018). Each worker clips
// its gradient, accumulates it with momentum correction, sends the ~k largest
// accumulated values as (index, value) pairs and keeps the rest for later.
//
//   GC_ASSIGN_OR_RETURN(auto codec, TopKCodec::Create(CodecParams(
//                           {{"ratio", "0.001"}, {"momentum", "0.9"}})));
//   GC_RETURN_IF_ERROR(codec->Encode(grad, state, ctx, &payload));
//   GC_RETURN_IF_ERROR(codec->DecodeAdd(payload, 1.0f / world_size, out));
//
// Payload (after the wire header, little-endian): parameters are 8 bytes,
// [0] index coding (1 = gaps bit-packed per block, index_coding.h), [1..3]
// zero, [4..7] uint32 count c; the body is the c strictly ascending indices
// so coded, then c fp32 values.
// The decoded average is the update itself: apply it without the optimizer's
// own momentum (that lives in this codec's state, "dgc.u" and "dgc.v").
#ifndef GRADCOMP_CODECS_CPU_TOPK_H_
#define GRADCOMP_CODECS_CPU_TOPK_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "codecs/codec.h"
#include "codecs/cpu/momentum.h"
#include "codecs/cpu/select.h"
#include "codecs/cpu/sparse_payload.h"
#include "codecs/params.h"
#include "codecs/random.h"
#include "codecs/registry.h"

namespace gradcomp::codecs {

struct TopKOptions {
  double ratio = 0.001;  // density k / n after warm-up, in (0, 1]
  double sample = 0.01;  // fraction of v sampled for the threshold, (0, 1]
  float momentum = 0.9f;
  bool nesterov = false;
  bool masking = true;  // momentum factor masking
  // Local L2 clipping of g before it is accumulated, to this norm per
  // tensor; 0 = off. An absolute threshold: the DGC paper scales a global
  // threshold by N^(-1/2) for each of N workers, so to follow it give
  // threshold / sqrt(W).
  double clip_norm = 0;
  // Warm-up: steps [s*i, s*(i+1)) use density max(ratio, {0.25, 0.0625,
  // 0.0156, 0.004}[i]) for i < 4, then `ratio`. 0 = off (the default: the
  // paper counts epochs, which only the trainer knows; set s to the steps of
  // an epoch to follow it).
  int64_t warmup_steps_per_stage = 0;
};

class TopKCodec : public SingleRoundCodec {
 public:
  // Parses and checks "ratio", "sample", "momentum", "nesterov", "masking",
  // "clip_norm" and "warmup_steps_per_stage"; rejects unknown names.
  static absl::StatusOr<std::unique_ptr<TopKCodec>> Create(
      const CodecParams& params);

  explicit TopKCodec(const TopKOptions& options);

  const CodecInfo& info() const override { return info_; }

  // InvalidArgument when the accumulated v holds NaN or Inf (a NaN or Inf
  // in g, or momentum that overflowed): no payload may carry it, so the
  // step is refused, and those coordinates of the state restart from zero
  // while the finite ones keep what they accumulated.
  absl::Status Encode(const TensorView& grad, TensorState& state,
                      const StepContext& ctx, Bytes* payload) const override;

  // A payload that holds NaN or Inf is a bad payload, as ParseTopKPayload
  // says.
  // Undoes the momentum correction's step (MomentumCorrection::Revert).
  void Revert(const TensorView& grad, TensorState& state,
              const StepContext& ctx, absl::string_view payload) const override;
  absl::Status DecodeAdd(absl::string_view payload, float alpha,
                         absl::Span<float> acc) const override;

  // The base's mean of the decodes (same order, same values), written
  // straight into `out` once every payload has been checked: no
  // tensor-sized zeroed scratch and copy. A bad payload still leaves `out`
  // untouched and gives the base's error.
  absl::Status FinishGather(absl::Span<const Bytes> payloads,
                            const StepContext& ctx,
                            absl::Span<float> out) const override;

  // How Encode picks the indices of the accumulated v to send: SelectTopK
  // here; the GPU twin (codecs/cuda) selects on the device, same result.
  using Selector = absl::FunctionRef<absl::StatusOr<TopKSelection>(
      absl::Span<const float> v, size_t k, double sample,
      const PhiloxStream& rng)>;
  // Encode, with `select` in place of SelectTopK. When `select` fails the
  // state is as it was, to within rounding.
  absl::Status EncodeWith(const TensorView& grad, TensorState& state,
                          const StepContext& ctx, Selector select,
                          Bytes* payload) const;

  // The density at `step` of the warm-up schedule (StepContext::step less
  // its warmup_offset).
  double DensityAt(int64_t step) const;
  // k = ceil(density * numel) at `step`, at least 1 for a nonempty tensor.
  size_t KAt(size_t numel, int64_t step) const;

  const TopKOptions& options() const { return options_; }

 private:
  // Encode's error for a v that holds NaN or Inf, once it has reset them
  // and given back the rest of the step (`g` x `scale`).
  absl::Status RefuseNonFinite(absl::Span<const float> g, float scale,
                               TensorState& state) const;

  TopKOptions options_;
  MomentumCorrection momentum_;
  CodecInfo info_;
};

CodecInfo TopKInfo();

// A top-k payload's (index, value) pairs, checked as DecodeAdd checks them
// for a tensor of n elements.
absl::StatusOr<SparsePairs> ParseTopKPayload(absl::string_view payload,
                                             size_t n);

// Registers "topk".
absl::Status RegisterTopK(CodecRegistry& registry);

}  // namespace gradcomp::codecs

#endif  // GRADCOMP_CODECS_CPU_TOPK_H_
