// DeviceCodecs with the CUDA runtime: codecs/cuda's twins of the CPU codecs.
#include <cuda_runtime_api.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "codecs/cuda/cuda_codec.h"
#include "codecs/cuda/device.h"
#include "codecs/cuda/nonfinite.h"
#include "codecs/params.h"
#include "service/engine/device_codecs.h"

namespace gradcomp::service {
namespace {

using codecs::cuda::CudaCodec;
using codecs::cuda::DeviceBuffer;
using codecs::cuda::SynchronizeStream;

class CudaTwin : public DeviceCodec {
 public:
  explicit CudaTwin(std::unique_ptr<CudaCodec> codec)
      : codec_(std::move(codec)) {}

  absl::Status Encode(int device_id, const float* grad, size_t n, int64_t rows,
                      codecs::TensorState& state,
                      const codecs::StepContext& ctx,
                      codecs::Bytes* payload) const override {
    GC_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_id));
    return codec_->EncodeDeviceRows(grad, n, rows, state, ctx, payload);
  }

  void Revert(int device_id, const float* grad, size_t n,
              absl::Span<const int64_t> shape, codecs::TensorState& state,
              const codecs::StepContext& ctx,
              absl::string_view payload) const override {
    std::vector<float> host(n);
    if (n > 0 && (cudaSetDevice(device_id) != cudaSuccess ||
                  cudaMemcpy(host.data(), grad, n * sizeof(float),
                             cudaMemcpyDeviceToHost) != cudaSuccess)) {
      state.Clear();
      return;
    }
    codec_->Revert(codecs::TensorView{host, shape}, state, ctx, payload);
  }

  absl::Status Finish(int device_id, const codecs::RoundResult& result,
                      const codecs::StepContext& ctx, float* out,
                      size_t n) const override {
    GC_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_id));
    const codecs::CodecInfo& info = codec_->info();
    if (info.summable || info.majority_vote) {
      // The collective summed the bodies on the host (or the codec's
      // average is a vote, not a mean of decodes): the CPU twin finishes
      // there, and the average, not the gradient, crosses back once.
      std::vector<float> average(n);
      GC_RETURN_IF_ERROR(info.summable
                             ? codec_->FinishSum(result.sum, result.world_size,
                                                 ctx, absl::MakeSpan(average))
                             : codec_->FinishGather(result.payloads, ctx,
                                                    absl::MakeSpan(average)));
      GC_CUDA_RETURN_IF_ERROR(cudaMemcpy(out, average.data(), n * sizeof(float),
                                         cudaMemcpyHostToDevice));
      return SynchronizeStream();
    }
    // SingleRoundCodec::FinishGather on the GPU: into zeroed scratch with
    // weight 1/W per payload, so that a bad payload leaves `out` as it was.
    if (result.payloads.empty() ||
        result.payloads.size() != static_cast<size_t>(result.world_size)) {
      return absl::InvalidArgumentError(absl::StrCat(
          info.name, ": expected ", result.world_size,
          " gathered payloads (one per worker, at least one), got ",
          result.payloads.size()));
    }
    GC_ASSIGN_OR_RETURN(DeviceBuffer scratch,
                        DeviceBuffer::Create(n * sizeof(float)));
    GC_CUDA_RETURN_IF_ERROR(cudaMemset(scratch.data(), 0, n * sizeof(float)));
    const float weight = 1.0f / static_cast<float>(result.payloads.size());
    for (size_t r = 0; r < result.payloads.size(); ++r) {
      absl::Status s = codec_->DecodeAddDevice(result.payloads[r], weight,
                                               scratch.as<float>(), n);
      if (!s.ok()) {
        return absl::Status(
            s.code(), absl::StrCat(info.name, ": payload of rank ", r, ": ",
                                   s.message()));
      }
    }
    GC_CUDA_RETURN_IF_ERROR(cudaMemcpy(out, scratch.data(), n * sizeof(float),
                                       cudaMemcpyDeviceToDevice));
    return SynchronizeStream();
  }

 private:
  std::unique_ptr<CudaCodec> codec_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceCodec>> CreateDeviceCodec(
    const CodecSpec& spec) {
  GC_RETURN_IF_ERROR(codecs::cuda::CudaDeviceAvailable());
  GC_ASSIGN_OR_RETURN(std::unique_ptr<CudaCodec> codec,
                      codecs::cuda::CreateCudaCodec(
                          spec.name, codecs::CodecParams(spec.params)));
  return std::unique_ptr<DeviceCodec>(new CudaTwin(std::move(codec)));
}

std::string ComputeDevice() {
  static const std::string* const device = [] {
    cudaDeviceProp properties;
    int count = 0;
    if (!codecs::cuda::CudaDeviceAvailable().ok() ||
        cudaGetDeviceCount(&count) != cudaSuccess ||
        cudaGetDeviceProperties(&properties, 0) != cudaSuccess) {
      return new std::string("cpu");
    }
    return new std::string(
        count > 1 ? absl::StrCat(properties.name, " (device 0 of ", count, ")")
                  : std::string(properties.name));
  }();
  return *device;
}

absl::Status CopyDeviceToHost(int device_id, const void* device,
                              absl::Span<char> host) {
  GC_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_id));
  GC_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(host.data(), device, host.size(), cudaMemcpyDeviceToHost));
  return absl::OkStatus();
}

absl::Status CopyHostToDevice(int device_id, absl::Span<const char> host,
                              void* device) {
  GC_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_id));
  GC_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(device, host.data(), host.size(), cudaMemcpyHostToDevice));
  return SynchronizeStream();
}

absl::StatusOr<uint64_t> CountNonfiniteOnDevice(int device_id,
                                                const float* values, size_t n) {
  GC_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_id));
  GC_ASSIGN_OR_RETURN(DeviceBuffer count,
                      DeviceBuffer::Create(sizeof(unsigned long long)));
  GC_CUDA_RETURN_IF_ERROR(
      cudaMemset(count.data(), 0, sizeof(unsigned long long)));
  GC_CUDA_RETURN_IF_ERROR(codecs::cuda::LaunchCountNonfinite(
      values, n, count.as<unsigned long long>(), nullptr));
  unsigned long long host = 0;
  GC_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(&host, count.data(), sizeof(host), cudaMemcpyDeviceToHost));
  return static_cast<uint64_t>(host);
}

}  // namespace gradcomp::service
