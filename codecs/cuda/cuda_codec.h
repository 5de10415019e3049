// GPU encoders behind the Codec interface. A CudaCodec is the twin of a CPU
// codec (codecs/cpu): it takes the same parameters, reports the same
// CodecInfo, and its payloads are the CPU codec's payloads byte for byte for
// the same input, seed, rank and step (docs/gpu.md), so either side decodes
// the other's.
//
//   GC_ASSIGN_OR_RETURN(std::unique_ptr<CudaCodec> codec,
//                       CreateCudaCodec("qsgd", CodecParams({{"bits", "4"}})));
//   GC_RETURN_IF_ERROR(codec->EncodeDevice(d_grad, n, ctx, &payload));
//
// Encoding runs on the GPU; decoding is still the CPU twin's (a GPU decoder is
// the next step, docs/gpu.md). Without a usable GPU, Encode and EncodeDevice
// return Unavailable and the caller encodes with the CPU codec.
#ifndef GRADCOMP_CODECS_CUDA_CUDA_CODEC_H_
#define GRADCOMP_CODECS_CUDA_CUDA_CODEC_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "codecs/codec.h"
#include "codecs/params.h"

namespace gradcomp::codecs::cuda {

class CudaCodec : public SingleRoundCodec {
 public:
  const CodecInfo& info() const override { return cpu_->info(); }

  // Encodes n fp32 values in device memory into a host payload.
  // Unavailable without a GPU; InvalidArgument where the CPU codec rejects
  // the input (NaN or Inf for int8 and qsgd).
  virtual absl::Status EncodeDevice(const float* grad, size_t n,
                                    const StepContext& ctx,
                                    Bytes* payload) const = 0;

  // Copies `grad` to the device and calls EncodeDevice.
  absl::Status Encode(const TensorView& grad, TensorState& state,
                      const StepContext& ctx, Bytes* payload) const final;

  // The CPU twin's decoders.
  absl::Status DecodeAdd(absl::string_view payload, float alpha,
                         absl::Span<float> acc) const final;
  absl::Status FinishSum(absl::Span<const float> sum, int world_size,
                         const StepContext& ctx,
                         absl::Span<float> out) const final;
  absl::Status FinishGather(absl::Span<const Bytes> payloads,
                            const StepContext& ctx,
                            absl::Span<float> out) const final;

 protected:
  explicit CudaCodec(std::unique_ptr<SingleRoundCodec> cpu);

 private:
  std::unique_ptr<SingleRoundCodec> cpu_;
};

// The registry names that have a GPU encoder: none, fp16, bf16, int8, qsgd.
std::vector<std::string> CudaCodecNames();

// The GPU twin of the CPU codec `name` with `params` (checked as the CPU
// codec checks them). NotFound for a name without a GPU encoder.
absl::StatusOr<std::unique_ptr<CudaCodec>> CreateCudaCodec(
    absl::string_view name, const CodecParams& params);

}  // namespace gradcomp::codecs::cuda

#endif  // GRADCOMP_CODECS_CUDA_CUDA_CODEC_H_
