#include "codecs/cuda/cuda_codec.h"

#include <cstdint>
#include <cstring>
#include <functional>
#include <utility>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "codecs/cpu/dense.h"
#include "codecs/cpu/int8.h"
#include "codecs/cpu/kernels.h"
#include "codecs/cpu/qsgd.h"
#include "codecs/cuda/device.h"
#include "codecs/cuda/kernels.h"
#include "codecs/random.h"
#include "codecs/registry.h"
#include "codecs/wire.h"

namespace gradcomp::codecs::cuda {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "parameter blocks are written with host-order memcpy");

// Writes a payload whose body `launch` fills in device memory: launch gets
// the device body and a zeroed device flag it sets when the input is not
// finite. Returns whether the flag was set.
absl::StatusOr<bool> EncodeWith(
    const WireHeader& header, absl::string_view params, size_t body_bytes,
    const std::function<cudaError_t(void* body, int* nonfinite)>& launch,
    Bytes* payload) {
  GC_RETURN_IF_ERROR(CudaDeviceAvailable());
  GC_ASSIGN_OR_RETURN(DeviceBuffer body, DeviceBuffer::Create(body_bytes));
  GC_ASSIGN_OR_RETURN(DeviceBuffer flag, DeviceBuffer::Create(sizeof(int)));
  GC_CUDA_RETURN_IF_ERROR(cudaMemset(flag.data(), 0, sizeof(int)));
  GC_CUDA_RETURN_IF_ERROR(launch(body.data(), flag.as<int>()));
  char* out = BeginPayload(header, params, body_bytes, payload);
  if (body_bytes > 0) {
    GC_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(out, body.data(), body_bytes, cudaMemcpyDeviceToHost));
  }
  int nonfinite = 0;
  GC_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(&nonfinite, flag.data(), sizeof(int), cudaMemcpyDeviceToHost));
  return nonfinite != 0;
}

PhiloxWords WordsOf(const PhiloxStream& stream) {
  const PhiloxStream::Words w = stream.GetWords();
  PhiloxWords out;
  std::memcpy(out.counter_tail, w.counter_tail, sizeof(out.counter_tail));
  std::memcpy(out.key, w.key, sizeof(out.key));
  return out;
}

// none / fp16 / bf16 (codecs/cpu/dense.cc).
class CudaDense : public CudaCodec {
 public:
  CudaDense(std::unique_ptr<SingleRoundCodec> cpu, ElemType type, bool prescale)
      : CudaCodec(std::move(cpu)), type_(type), prescale_(prescale) {}

  absl::Status EncodeDevice(const float* grad, size_t n, const StepContext& ctx,
                            Bytes* payload) const override {
    if (ctx.world_size < 1) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: expected a world size >= 1, got %d", info().name,
                          ctx.world_size));
    }
    const uint32_t divisor =
        prescale_ ? static_cast<uint32_t>(ctx.world_size) : 1;
    char params[8] = {static_cast<char>(type_)};
    std::memcpy(params + 4, &divisor, sizeof(divisor));
    WireHeader header;
    header.codec = info().id;
    header.flags = kFlagDenseBody;
    header.numel = n;
    const float scale = 1.0f / static_cast<float>(divisor);
    const ElemType type = type_;
    return EncodeWith(
               header, absl::string_view(params, sizeof(params)),
               n * ElemTypeBytes(type),
               [&](void* body, int*) {
                 if (n == 0) return cudaSuccess;
                 switch (type) {
                   case ElemType::kF16:
                     return LaunchFloatToHalf(grad, n, scale, body, nullptr);
                   case ElemType::kBF16:
                     return LaunchFloatToBf16(grad, n, scale, body, nullptr);
                   case ElemType::kF32:
                     break;
                 }
                 // The CPU copies an unscaled fp32 body (NaN payloads and
                 // all) rather than multiplying it by 1.
                 if (divisor == 1) {
                   return cudaMemcpyAsync(body, grad, 4 * n,
                                          cudaMemcpyDeviceToDevice, nullptr);
                 }
                 return LaunchScaleFloat(grad, n, scale, body, nullptr);
               },
               payload)
        .status();
  }

 private:
  const ElemType type_;
  const bool prescale_;
};

class CudaInt8 : public CudaCodec {
 public:
  CudaInt8(std::unique_ptr<SingleRoundCodec> cpu, Int8Options options)
      : CudaCodec(std::move(cpu)), options_(options) {}

  absl::Status EncodeDevice(const float* grad, size_t n, const StepContext& ctx,
                            Bytes* payload) const override {
    const size_t bucket = static_cast<size_t>(options_.bucket);
    const size_t buckets = (n + bucket - 1) / bucket;
    char params[8] = {};
    const uint32_t bucket32 = static_cast<uint32_t>(bucket);
    std::memcpy(params, &bucket32, sizeof(bucket32));
    params[4] = options_.stochastic ? 1 : 0;
    WireHeader header;
    header.codec = CodecId::kInt8;
    header.numel = n;
    const PhiloxWords rng = WordsOf(WorkerStream(ctx, /*round=*/0));
    const PhiloxWords* rng_or_null = options_.stochastic ? &rng : nullptr;
    GC_ASSIGN_OR_RETURN(
        const bool nonfinite,
        EncodeWith(
            header, absl::string_view(params, sizeof(params)), 8 * buckets + n,
            [&](void* body, int* flag) {
              return LaunchInt8Encode(grad, n, bucket, rng_or_null, body,
                                      static_cast<uint8_t*>(body) + 8 * buckets,
                                      flag, nullptr);
            },
            payload));
    if (nonfinite) {
      return absl::InvalidArgumentError(
          "int8: the gradient holds NaN or Inf; expected finite values");
    }
    return absl::OkStatus();
  }

 private:
  const Int8Options options_;
};

class CudaQsgd : public CudaCodec {
 public:
  CudaQsgd(std::unique_ptr<SingleRoundCodec> cpu, QsgdOptions options)
      : CudaCodec(std::move(cpu)), options_(options) {}

  absl::Status EncodeDevice(const float* grad, size_t n, const StepContext& ctx,
                            Bytes* payload) const override {
    const size_t bucket = static_cast<size_t>(options_.bucket);
    const int bits = options_.bits;
    const size_t buckets = (n + bucket - 1) / bucket;
    const size_t code_bytes = (n * bits + 7) / 8;
    char params[8] = {};
    const uint32_t bucket32 = static_cast<uint32_t>(bucket);
    std::memcpy(params, &bucket32, sizeof(bucket32));
    params[4] = static_cast<char>(bits);
    WireHeader header;
    header.codec = CodecId::kQsgd;
    header.numel = n;
    const PhiloxWords rng = WordsOf(WorkerStream(ctx, /*round=*/0));
    GC_ASSIGN_OR_RETURN(const bool nonfinite,
                        EncodeWith(
                            header, absl::string_view(params, sizeof(params)),
                            4 * buckets + code_bytes,
                            [&](void* body, int* flag) {
                              return LaunchQsgdEncode(
                                  grad, n, bucket, bits, rng, body,
                                  static_cast<uint8_t*>(body) + 4 * buckets,
                                  flag, nullptr);
                            },
                            payload));
    if (nonfinite) {
      return absl::InvalidArgumentError(
          "qsgd: the gradient holds NaN or Inf (a bucket's norm is not "
          "finite); expected finite values");
    }
    return absl::OkStatus();
  }

 private:
  const QsgdOptions options_;
};

absl::StatusOr<std::unique_ptr<SingleRoundCodec>> AsSingleRound(
    std::unique_ptr<Codec> codec) {
  auto* single = dynamic_cast<SingleRoundCodec*>(codec.get());
  if (single == nullptr) {
    return absl::InternalError(absl::StrFormat(
        "codec '%s' is not a single-round codec", codec->info().name));
  }
  codec.release();
  return std::unique_ptr<SingleRoundCodec>(single);
}

absl::StatusOr<std::unique_ptr<CudaCodec>> CreateDense(
    absl::string_view name, ElemType type, const CodecParams& params) {
  CodecRegistry registry;
  GC_RETURN_IF_ERROR(RegisterDenseCodecs(registry));
  GC_ASSIGN_OR_RETURN(std::unique_ptr<Codec> cpu,
                      registry.Create(name, params));
  GC_ASSIGN_OR_RETURN(const bool prescale, params.GetBool("prescale", false));
  GC_ASSIGN_OR_RETURN(std::unique_ptr<SingleRoundCodec> twin,
                      AsSingleRound(std::move(cpu)));
  return std::unique_ptr<CudaCodec>(
      new CudaDense(std::move(twin), type, prescale));
}

}  // namespace

CudaCodec::CudaCodec(std::unique_ptr<SingleRoundCodec> cpu)
    : cpu_(std::move(cpu)) {}

absl::Status CudaCodec::Encode(const TensorView& grad, TensorState& /*state*/,
                               const StepContext& ctx, Bytes* payload) const {
  GC_RETURN_IF_ERROR(CudaDeviceAvailable());
  const size_t bytes = grad.numel() * sizeof(float);
  GC_ASSIGN_OR_RETURN(DeviceBuffer device, DeviceBuffer::Create(bytes));
  if (bytes > 0) {
    GC_CUDA_RETURN_IF_ERROR(cudaMemcpy(device.data(), grad.values.data(), bytes,
                                       cudaMemcpyHostToDevice));
  }
  return EncodeDevice(device.as<float>(), grad.numel(), ctx, payload);
}

absl::Status CudaCodec::DecodeAdd(absl::string_view payload, float alpha,
                                  absl::Span<float> acc) const {
  return cpu_->DecodeAdd(payload, alpha, acc);
}

absl::Status CudaCodec::FinishSum(absl::Span<const float> sum, int world_size,
                                  const StepContext& ctx,
                                  absl::Span<float> out) const {
  return cpu_->FinishSum(sum, world_size, ctx, out);
}

absl::Status CudaCodec::FinishGather(absl::Span<const Bytes> payloads,
                                     const StepContext& ctx,
                                     absl::Span<float> out) const {
  return cpu_->FinishGather(payloads, ctx, out);
}

std::vector<std::string> CudaCodecNames() {
  return {"none", "fp16", "bf16", "int8", "qsgd"};
}

absl::StatusOr<std::unique_ptr<CudaCodec>> CreateCudaCodec(
    absl::string_view name, const CodecParams& params) {
  if (name == "none") return CreateDense(name, ElemType::kF32, params);
  if (name == "fp16") return CreateDense(name, ElemType::kF16, params);
  if (name == "bf16") return CreateDense(name, ElemType::kBF16, params);
  if (name == "int8") {
    GC_ASSIGN_OR_RETURN(std::unique_ptr<Int8Codec> cpu,
                        Int8Codec::Create(params));
    const Int8Options options = cpu->options();
    return std::unique_ptr<CudaCodec>(new CudaInt8(std::move(cpu), options));
  }
  if (name == "qsgd") {
    GC_ASSIGN_OR_RETURN(std::unique_ptr<QsgdCodec> cpu,
                        QsgdCodec::Create(params));
    const QsgdOptions options = cpu->options();
    return std::unique_ptr<CudaCodec>(new CudaQsgd(std::move(cpu), options));
  }
  return absl::NotFoundError(
      absl::StrFormat("no GPU encoder for codec '%s'; expected one of: %s",
                      name, absl::StrJoin(CudaCodecNames(), ", ")));
}

}  // namespace gradcomp::codecs::cuda
