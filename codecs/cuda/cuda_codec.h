// GPU encoders behind the Codec interface. A CudaCodec is the twin of a CPU
// codec (codecs/cpu): it takes the same parameters, reports the same
// CodecInfo, and its payloads are the CPU codec's payloads byte for byte for
// the same input, seed, rank and step (docs/gpu.md), so either side decodes
// the other's.
//
//   GC_ASSIGN_OR_RETURN(std::unique_ptr<CudaCodec> codec,
//                       CreateCudaCodec("qsgd", CodecParams({{"bits", "4"}})));
//   GC_RETURN_IF_ERROR(codec->EncodeDevice(d_grad, n, state, ctx, &payload));
//   GC_RETURN_IF_ERROR(codec->DecodeAddDevice(payload, 1.0f, d_acc, n));
//
// Encode, EncodeDevice and DecodeAddDevice (into device memory) run on the
// GPU; DecodeAdd into host memory is the CPU twin's. Without a usable GPU
// they return Unavailable and the caller uses the CPU codec.
#ifndef GRADCOMP_CODECS_CUDA_CUDA_CODEC_H_
#define GRADCOMP_CODECS_CUDA_CUDA_CODEC_H_

#include <cstddef>
#include <cstdint>
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

  // Encodes n fp32 values in device memory into a host payload; `state` is
  // the tensor's state as the CPU twin keeps it (top-k's momentum and
  // residual, host memory). Unavailable without a GPU, and then the state
  // is untouched; InvalidArgument where the CPU codec rejects the input
  // (NaN or Inf for int8 and qsgd).
  virtual absl::Status EncodeDevice(const float* grad, size_t n,
                                    TensorState& state, const StepContext& ctx,
                                    Bytes* payload) const = 0;

  // EncodeDevice for a tensor of `rows` rows (shape[0]); Encode calls it.
  // Only the codecs that look at the shape (onebit's columns) override it;
  // EncodeDevice itself sees a 1-D tensor.
  virtual absl::Status EncodeDeviceRows(const float* grad, size_t n,
                                        int64_t rows, TensorState& state,
                                        const StepContext& ctx,
                                        Bytes* payload) const;

  // acc (n fp32 values in device memory) += alpha * the decoded payload
  // (host bytes), computed on the GPU with the CPU twin's arithmetic: the
  // same bits as the CPU twin's DecodeAdd for payloads without NaN (a NaN
  // stays NaN; its payload bits may differ). The payload is checked first,
  // as the CPU twin checks it (InvalidArgument); then Unavailable without a
  // GPU. Returns once the sum is written.
  virtual absl::Status DecodeAddDevice(absl::string_view payload, float alpha,
                                       float* acc, size_t n) const = 0;

  // Copies `grad` to the device and calls EncodeDevice (top-k, whose state
  // is on the host, selects on the GPU from there).
  absl::Status Encode(const TensorView& grad, TensorState& state,
                      const StepContext& ctx, Bytes* payload) const override;

  // The CPU twin's Revert: the state is the CPU's, on the host, and
  // `grad` host memory.
  void Revert(const TensorView& grad, TensorState& state,
              const StepContext& ctx, absl::string_view payload) const final;

  // The CPU twin's decoders (into host memory).
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

// The registry names that have a GPU encoder: none, fp16, bf16, int8, qsgd,
// topk, signsgd, signum, efsign, onebit, terngrad, randomk.
std::vector<std::string> CudaCodecNames();

// The GPU twin of the CPU codec `name` with `params` (checked as the CPU
// codec checks them). NotFound for a name without a GPU encoder.
absl::StatusOr<std::unique_ptr<CudaCodec>> CreateCudaCodec(
    absl::string_view name, const CodecParams& params);

}  // namespace gradcomp::codecs::cuda

#endif  // GRADCOMP_CODECS_CUDA_CUDA_CODEC_H_
