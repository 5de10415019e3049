#include "codecs/cuda/cuda_codec.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "codecs/cpu/bitpack.h"
#include "codecs/cpu/dense.h"
#include "codecs/cpu/int8.h"
#include "codecs/cpu/kernels.h"
#include "codecs/cpu/onebit.h"
#include "codecs/cpu/qsgd.h"
#include "codecs/cpu/randomk.h"
#include "codecs/cpu/select.h"
#include "codecs/cpu/sign.h"
#include "codecs/cpu/terngrad.h"
#include "codecs/cpu/topk.h"
#include "codecs/cuda/decode.h"
#include "codecs/cuda/device.h"
#include "codecs/cuda/kernels.h"
#include "codecs/cuda/onebit_kernels.h"
#include "codecs/cuda/philox_words.h"
#include "codecs/cuda/randomk_kernels.h"
#include "codecs/cuda/segment_sums.h"
#include "codecs/cuda/select.h"
#include "codecs/cuda/sign_kernels.h"
#include "codecs/cuda/terngrad_kernels.h"
#include "codecs/error_feedback.h"
#include "codecs/params.h"
#include "codecs/random.h"
#include "codecs/registry.h"
#include "codecs/wire.h"

namespace gradcomp::codecs::cuda {

static_assert(kTinySumOfSquares == codecs::kTinySumOfSquares,
              "the kernels must send to the host what the CPU sums in double");

namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "parameter blocks are written with host-order memcpy");

using BodyLaunch = std::function<cudaError_t(void* body, int* nonfinite)>;

// Writes a payload whose header and parameter block `begin` writes (it
// returns the host body of body_bytes) and whose body `launch` fills in
// device memory: launch gets the device body and a zeroed device flag it
// sets when the input is not finite. Returns whether the flag was set.
absl::StatusOr<bool> EncodeWith(const std::function<char*()>& begin,
                                size_t body_bytes, const BodyLaunch& launch) {
  GC_RETURN_IF_ERROR(CudaDeviceAvailable());
  GC_ASSIGN_OR_RETURN(DeviceBuffer body, DeviceBuffer::Create(body_bytes));
  GC_ASSIGN_OR_RETURN(DeviceBuffer flag, DeviceBuffer::Create(sizeof(int)));
  GC_CUDA_RETURN_IF_ERROR(cudaMemset(flag.data(), 0, sizeof(int)));
  GC_CUDA_RETURN_IF_ERROR(launch(body.data(), flag.as<int>()));
  char* out = begin();
  if (body_bytes > 0) {
    GC_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(out, body.data(), body_bytes, cudaMemcpyDeviceToHost));
  }
  int nonfinite = 0;
  GC_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(&nonfinite, flag.data(), sizeof(int), cudaMemcpyDeviceToHost));
  return nonfinite != 0;
}

// EncodeWith for a payload of `header` and `params`.
absl::StatusOr<bool> EncodeWith(const WireHeader& header,
                                absl::string_view params, size_t body_bytes,
                                const BodyLaunch& launch, Bytes* payload) {
  return EncodeWith(
      [&] { return BeginPayload(header, params, body_bytes, payload); },
      body_bytes, launch);
}

// Copies a checked payload body to the device, runs `launch` on the copy
// and waits for it, so that a kernel's error is this call's.
absl::Status DecodeWith(
    absl::string_view body,
    const std::function<cudaError_t(const char* device_body)>& launch) {
  GC_RETURN_IF_ERROR(CudaDeviceAvailable());
  GC_ASSIGN_OR_RETURN(DeviceBuffer device, DeviceBuffer::Create(body.size()));
  if (!body.empty()) {
    GC_CUDA_RETURN_IF_ERROR(cudaMemcpy(device.data(), body.data(), body.size(),
                                       cudaMemcpyHostToDevice));
  }
  GC_CUDA_RETURN_IF_ERROR(launch(device.as<const char>()));
  return SynchronizeStream();
}

// The dense codecs' parameter block (codecs/cpu/dense.cc): the element
// type, three zero bytes, the u32 prescale divisor (>= 1).
constexpr size_t kDenseParamBytes = 8;

// none / fp16 / bf16 (codecs/cpu/dense.cc).
class CudaDense : public CudaCodec {
 public:
  CudaDense(std::unique_ptr<SingleRoundCodec> cpu, ElemType type, bool prescale)
      : CudaCodec(std::move(cpu)), type_(type), prescale_(prescale) {}

  absl::Status EncodeDevice(const float* grad, size_t n, TensorState& /*state*/,
                            const StepContext& ctx,
                            Bytes* payload) const override {
    if (ctx.world_size < 1) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: expected a world size >= 1, got %d", info().name,
                          ctx.world_size));
    }
    const uint32_t divisor =
        prescale_ ? static_cast<uint32_t>(ctx.world_size) : 1;
    char params[kDenseParamBytes] = {static_cast<char>(type_)};
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

  absl::Status DecodeAddDevice(absl::string_view payload, float alpha,
                               float* acc, size_t n) const override {
    GC_ASSIGN_OR_RETURN(const DensePayload parsed,
                        ParseDensePayload(payload, type_, n));
    // The CPU's scale: alpha * divisor, rounded to fp32 on the host.
    const float scale = alpha * static_cast<float>(parsed.divisor);
    const ElemType type = type_;
    return DecodeWith(parsed.body, [&](const char* body) {
      switch (type) {
        case ElemType::kF16:
          return LaunchAddHalf(body, n, scale, acc, nullptr);
        case ElemType::kBF16:
          return LaunchAddBf16(body, n, scale, acc, nullptr);
        case ElemType::kF32:
          break;
      }
      return LaunchAddFloat(body, n, scale, acc, nullptr);
    });
  }

 private:
  const ElemType type_;
  const bool prescale_;
};

// int8 and qsgd payloads (codecs/cpu/int8.h, qsgd.h): header flags 0 and an
// 8-byte parameter block of the u32 bucket, one option byte (int8: rounding,
// qsgd: bits) and three zero bytes; the body is a per-bucket table, then the
// codes.
constexpr size_t kBucketedParamBytes = 8;

// Encodes n values of `grad` into the bucketed layout: `launch` gets the
// worker's Philox stream, the device table, the codes after it and the
// non-finite flag.
absl::Status EncodeBucketed(
    CodecId id, size_t bucket, uint8_t option, size_t n, size_t table_bytes,
    size_t code_bytes, const StepContext& ctx, absl::string_view nonfinite,
    const std::function<cudaError_t(const PhiloxWords& rng, void* table,
                                    uint8_t* codes, int* flag)>& launch,
    Bytes* payload) {
  char params[kBucketedParamBytes] = {};
  const uint32_t bucket32 = static_cast<uint32_t>(bucket);
  std::memcpy(params, &bucket32, sizeof(bucket32));
  params[4] = static_cast<char>(option);
  WireHeader header;
  header.codec = id;
  header.numel = n;
  const PhiloxWords rng = ToPhiloxWords(WorkerStream(ctx, /*round=*/0));
  GC_ASSIGN_OR_RETURN(
      const bool bad,
      EncodeWith(
          header, absl::string_view(params, sizeof(params)),
          table_bytes + code_bytes,
          [&](void* body, int* flag) {
            return launch(rng, body, static_cast<uint8_t*>(body) + table_bytes,
                          flag);
          },
          payload));
  if (bad) return absl::InvalidArgumentError(nonfinite);
  return absl::OkStatus();
}

class CudaInt8 : public CudaCodec {
 public:
  CudaInt8(std::unique_ptr<SingleRoundCodec> cpu, Int8Options options)
      : CudaCodec(std::move(cpu)), options_(options) {}

  absl::Status EncodeDevice(const float* grad, size_t n, TensorState& /*state*/,
                            const StepContext& ctx,
                            Bytes* payload) const override {
    const size_t bucket = static_cast<size_t>(options_.bucket);
    const bool stochastic = options_.stochastic;
    return EncodeBucketed(
        CodecId::kInt8, bucket, stochastic ? 1 : 0, n,
        8 * ((n + bucket - 1) / bucket), n, ctx,
        "int8: the gradient holds NaN or Inf; expected finite values",
        [&](const PhiloxWords& rng, void* ranges, uint8_t* codes, int* flag) {
          return LaunchInt8Encode(grad, n, bucket, stochastic ? &rng : nullptr,
                                  ranges, codes, flag, nullptr);
        },
        payload);
  }

  absl::Status DecodeAddDevice(absl::string_view payload, float alpha,
                               float* acc, size_t n) const override {
    GC_ASSIGN_OR_RETURN(const Int8Payload p, ParseInt8Payload(payload, n));
    return DecodeWith(p.body, [&](const char* body) {
      return LaunchInt8DecodeAdd(
          body, reinterpret_cast<const uint8_t*>(body) + 8 * p.buckets, n,
          p.bucket, alpha, acc, nullptr);
    });
  }

 private:
  const Int8Options options_;
};

class CudaQsgd : public CudaCodec {
 public:
  // `twin` is `cpu`, kept typed for the host fallback.
  CudaQsgd(std::unique_ptr<QsgdCodec> cpu, const QsgdCodec* twin)
      : CudaCodec(std::move(cpu)), twin_(twin), options_(twin->options()) {}

  absl::Status EncodeDevice(const float* grad, size_t n, TensorState& state,
                            const StepContext& ctx,
                            Bytes* payload) const override {
    const absl::Status status = EncodeOnDevice(grad, n, ctx, payload);
    if (status.code() != absl::StatusCode::kInvalidArgument) return status;
    // A bucket's norm is not finite in fp32: NaN or Inf in it, or finite
    // values whose squares overflow (above about 1.8e19), where the CPU's
    // BucketNorm sums in double instead. Rare: the host encodes, as the CPU
    // does, and says which.
    std::vector<float> host(n);
    GC_RETURN_IF_ERROR(CopyToHost(grad, absl::MakeSpan(host)));
    const int64_t shape[] = {static_cast<int64_t>(n)};
    return twin_->Encode(TensorView{host, shape}, state, ctx, payload);
  }

  absl::Status DecodeAddDevice(absl::string_view payload, float alpha,
                               float* acc, size_t n) const override {
    GC_ASSIGN_OR_RETURN(const QsgdPayload p, ParseQsgdPayload(payload, n));
    return DecodeWith(p.body, [&](const char* body) {
      return LaunchQsgdDecodeAdd(
          body, reinterpret_cast<const uint8_t*>(body) + 4 * p.buckets, n,
          p.bucket, p.bits, alpha, acc, nullptr);
    });
  }

 private:
  absl::Status EncodeOnDevice(const float* grad, size_t n,
                              const StepContext& ctx, Bytes* payload) const {
    const size_t bucket = static_cast<size_t>(options_.bucket);
    const int bits = options_.bits;
    return EncodeBucketed(
        CodecId::kQsgd, bucket, static_cast<uint8_t>(bits), n,
        4 * ((n + bucket - 1) / bucket), (n * bits + 7) / 8, ctx,
        kQsgdNonFiniteNorm,
        [&](const PhiloxWords& rng, void* norms, uint8_t* codes, int* flag) {
          return LaunchQsgdEncode(grad, n, bucket, bits, rng, norms, codes,
                                  flag, nullptr);
        },
        payload);
  }

  const QsgdCodec* twin_;
  const QsgdOptions options_;
};

// DGC top-k (codecs/cpu/topk.cc). Clipping, momentum correction, the state
// and the payload are the CPU codec's own (TopKCodec::EncodeWith); the
// selection, the pass over the whole tensor, runs on the GPU (select.h).
// The payload is the CPU's byte for byte. Keeping u and v on the device is
// the next step (docs/gpu.md).
class CudaTopK : public CudaCodec {
 public:
  // `twin` is `cpu`, kept typed for EncodeWith.
  CudaTopK(std::unique_ptr<TopKCodec> cpu, const TopKCodec* twin)
      : CudaCodec(std::move(cpu)), twin_(twin) {}

  absl::Status Encode(const TensorView& grad, TensorState& state,
                      const StepContext& ctx, Bytes* payload) const override {
    // Asked before the state changes: without a GPU it stays as it was.
    GC_RETURN_IF_ERROR(CudaDeviceAvailable());
    return twin_->EncodeWith(
        grad, state, ctx,
        [](absl::Span<const float> v, size_t k, double sample,
           const PhiloxStream& rng) -> absl::StatusOr<TopKSelection> {
          GC_ASSIGN_OR_RETURN(DeviceBuffer device,
                              DeviceBuffer::Create(v.size() * sizeof(float)));
          if (!v.empty()) {
            GC_CUDA_RETURN_IF_ERROR(cudaMemcpy(device.data(), v.data(),
                                               v.size() * sizeof(float),
                                               cudaMemcpyHostToDevice));
          }
          return SelectTopKDevice(device.as<float>(), v.size(), k, sample, rng);
        },
        payload);
  }

  // The state is on the host, so the gradient goes there first.
  absl::Status EncodeDevice(const float* grad, size_t n, TensorState& state,
                            const StepContext& ctx,
                            Bytes* payload) const override {
    GC_RETURN_IF_ERROR(CudaDeviceAvailable());
    std::vector<float> host(n);
    if (n > 0) {
      GC_CUDA_RETURN_IF_ERROR(cudaMemcpy(host.data(), grad, n * sizeof(float),
                                         cudaMemcpyDeviceToHost));
    }
    const std::vector<int64_t> shape = {static_cast<int64_t>(n)};
    return Encode(TensorView{host, shape}, state, ctx, payload);
  }

  // The CPU decoder's checks, the scatter-add on the GPU.
  absl::Status DecodeAddDevice(absl::string_view payload, float alpha,
                               float* acc, size_t n) const override {
    GC_ASSIGN_OR_RETURN(const SparsePairs pairs, ParseTopKPayload(payload, n));
    const std::vector<uint32_t>& indices = pairs.indices;
    const size_t count = indices.size();
    for (size_t j = 1; j < count; ++j) {
      if (indices[j] <= indices[j - 1]) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "topk: expected strictly ascending indices; index %d is %d after "
            "%d",
            j, indices[j], indices[j - 1]));
      }
    }
    // Indices, then values, as one block for the device.
    std::string staged(8 * count, '\0');
    if (count > 0) {
      std::memcpy(staged.data(), indices.data(), 4 * count);
      std::memcpy(staged.data() + 4 * count, pairs.values.data(), 4 * count);
    }
    return DecodeWith(staged, [&](const char* block) {
      return LaunchScatterAdd(reinterpret_cast<const uint32_t*>(block),
                              reinterpret_cast<const float*>(block + 4 * count),
                              count, alpha, acc, nullptr);
    });
  }

 private:
  const TopKCodec* twin_;  // owned by CudaCodec
};

// Copies n host floats to a new device buffer.
absl::StatusOr<DeviceBuffer> Upload(absl::Span<const float> host) {
  GC_ASSIGN_OR_RETURN(DeviceBuffer device,
                      DeviceBuffer::Create(host.size() * sizeof(float)));
  GC_RETURN_IF_ERROR(CopyToDevice(host, device.as<float>()));
  return device;
}

// The ErrorFeedback decorator (codecs/error_feedback.h) around a GPU codec:
// the residual stays in the tensor's state on the host and visits the
// device for the step (p = e + g, encode p, p -= decode), with the CPU
// decorator's arithmetic, so the residual is the CPU's bit for bit. The
// host's residual changes only when the step succeeds: a failed one leaves
// it as it was, as on the CPU.
class CudaErrorFeedback : public CudaCodec {
 public:
  CudaErrorFeedback(std::unique_ptr<SingleRoundCodec> cpu,
                    std::unique_ptr<CudaCodec> inner)
      : CudaCodec(std::move(cpu)), inner_(std::move(inner)) {}

  absl::Status EncodeDevice(const float* grad, size_t n, TensorState& state,
                            const StepContext& ctx,
                            Bytes* payload) const override {
    return EncodeDeviceRows(grad, n, static_cast<int64_t>(n), state, ctx,
                            payload);
  }

  absl::Status EncodeDeviceRows(const float* grad, size_t n, int64_t rows,
                                TensorState& state, const StepContext& ctx,
                                Bytes* payload) const override {
    GC_RETURN_IF_ERROR(CudaDeviceAvailable());
    absl::Span<float> residual = state.Buffer(kErrorFeedbackBuffer, n);
    GC_ASSIGN_OR_RETURN(DeviceBuffer p, Upload(residual));
    // p += 1 * g is the CPU's p += g.
    GC_CUDA_RETURN_IF_ERROR(
        LaunchAddFloat(grad, n, 1.0f, p.as<float>(), nullptr));
    // As on the CPU, the inner codec refuses a non-finite p it would send.
    GC_RETURN_IF_ERROR(
        inner_->EncodeDeviceRows(p.as<float>(), n, rows, state, ctx, payload));
    GC_RETURN_IF_ERROR(
        inner_->DecodeAddDevice(*payload, -1.0f, p.as<float>(), n));
    return CopyToHost(p.as<float>(), residual);
  }

  absl::Status DecodeAddDevice(absl::string_view payload, float alpha,
                               float* acc, size_t n) const override {
    return inner_->DecodeAddDevice(payload, alpha, acc, n);
  }

 private:
  std::unique_ptr<CudaCodec> inner_;
};

// The sign codecs (codecs/cpu/sign.h). The signs are packed on the GPU;
// each scale s = fp32(l1 / len) needs l1, the CPU's sequential double sum
// of the lanes' |x| sums (bitpack.h PackSigns). The GPU sums the same terms
// in parallel; where s is the same at both ends of the interval that holds
// the CPU's sum (segment_sums.h), it is the CPU's s, and otherwise (a sum
// next to a rounding boundary of s, rare) the host runs PackSigns on that
// bucket. Signum's momentum stays in the state on the host and visits the
// device for the step.
class CudaSign : public CudaCodec {
 public:
  CudaSign(std::unique_ptr<SingleRoundCodec> cpu, SignCodec::Variant variant,
           float momentum, size_t bucket)
      : CudaCodec(std::move(cpu)),
        variant_(variant),
        momentum_(momentum),
        bucket_(bucket) {}

  absl::Status EncodeDevice(const float* grad, size_t n, TensorState& state,
                            const StepContext& /*ctx*/,
                            Bytes* payload) const override {
    GC_RETURN_IF_ERROR(CudaDeviceAvailable());
    if (variant_ != SignCodec::Variant::kSignum) {
      return EncodeSigns(grad, n, payload);
    }
    absl::Span<float> momentum = state.Buffer(SignCodec::kMomentumBuffer, n);
    GC_ASSIGN_OR_RETURN(DeviceBuffer m, Upload(momentum));
    GC_CUDA_RETURN_IF_ERROR(LaunchMomentumUpdate(
        grad, n, momentum_, 1.0f - momentum_, m.as<float>(), nullptr));
    const absl::Status status = EncodeSigns(m.as<float>(), n, payload);
    if (status.code() == absl::StatusCode::kInvalidArgument) {
      // As the CPU: a momentum holding NaN would poison every later step.
      std::fill(momentum.begin(), momentum.end(), 0.0f);
      return status;
    }
    // Another failure (device memory, a CUDA error) leaves the host's
    // momentum as it was: the step took nothing.
    GC_RETURN_IF_ERROR(status);
    return CopyToHost(m.as<float>(), momentum);
  }

  absl::Status DecodeAddDevice(absl::string_view payload, float alpha,
                               float* acc, size_t n) const override {
    GC_ASSIGN_OR_RETURN(const SignPayload p,
                        ParseSignPayload(variant_, payload, n));
    const size_t scales = p.scales.size();
    return DecodeWith(p.body, [&](const char* body) {
      return LaunchSignDecodeAdd(
          reinterpret_cast<const float*>(body), body + 4 * scales, n,
          p.bucket == 0 ? n : p.bucket, alpha, acc, nullptr);
    });
  }

 private:
  static constexpr size_t kParamBytes = 8;  // u32 bucket, 4 zero bytes

  static size_t ScaleCount(size_t n, size_t bucket) {
    return bucket == 0 ? 1 : (n + bucket - 1) / bucket;
  }

  // The payload of the signs of x (device memory): SignCodec::Encode's.
  absl::Status EncodeSigns(const float* x, size_t n, Bytes* payload) const {
    const size_t scales = ScaleCount(n, bucket_);
    const size_t span = bucket_ == 0 ? n : bucket_;
    const size_t blocks = (n + 63) / 64;
    GC_ASSIGN_OR_RETURN(DeviceBuffer signs, DeviceBuffer::Create(SignBytes(n)));
    GC_ASSIGN_OR_RETURN(DeviceBuffer block_sums,
                        DeviceBuffer::Create(sizeof(double) * blocks));
    GC_ASSIGN_OR_RETURN(DeviceBuffer sums,
                        DeviceBuffer::Create(sizeof(double) * scales));
    GC_CUDA_RETURN_IF_ERROR(
        LaunchSignPack(x, n, signs.data(), block_sums.as<double>(), nullptr));
    GC_CUDA_RETURN_IF_ERROR(LaunchSegmentSums(
        block_sums.as<double>(), blocks,
        bucket_ == 0 ? std::max<size_t>(blocks, 1) : bucket_ / 64,
        sums.as<double>(), nullptr));
    char params[kParamBytes] = {};
    const uint32_t bucket32 = static_cast<uint32_t>(bucket_);
    std::memcpy(params, &bucket32, sizeof(bucket32));
    WireHeader header;
    header.codec = info().id;
    header.numel = n;
    char* body = BeginPayload(
        header, absl::string_view(params, bucket_ == 0 ? 0 : kParamBytes),
        4 * scales + SignBytes(n), payload);
    std::vector<double> l1(scales, 0.0);
    if (n > 0) {
      GC_CUDA_RETURN_IF_ERROR(cudaMemcpy(body + 4 * scales, signs.data(),
                                         SignBytes(n), cudaMemcpyDeviceToHost));
      GC_CUDA_RETURN_IF_ERROR(cudaMemcpy(l1.data(), sums.data(),
                                         sizeof(double) * scales,
                                         cudaMemcpyDeviceToHost));
    }
    for (size_t b = 0; b < scales; ++b) {
      const size_t begin = b * span;
      const size_t len = std::min(span, n - begin);
      float scale = 0.0f;
      if (len > 0) {
        const auto scale_of = [len](double sum) {
          return static_cast<float>(sum / len);
        };
        if (!std::isfinite(l1[b])) {
          // NaN or Inf in x, or an fp32 lane that overflowed on finite
          // values, which PackSigns sums again in double.
          GC_ASSIGN_OR_RETURN(scale, HostScale(x + begin, len));
        } else {
          const SumInterval in = SumIntervalOf(l1[b], 8 * ((len + 63) / 64));
          if (scale_of(in.lo) != scale_of(in.hi)) {
            GC_ASSIGN_OR_RETURN(scale, HostScale(x + begin, len));
          } else {
            scale = scale_of(in.lo);
          }
        }
      }
      if (!std::isfinite(scale)) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s: the %s holds NaN or Inf; expected finite values", info().name,
            variant_ == SignCodec::Variant::kSignum ? "momentum" : "gradient"));
      }
      std::memcpy(body + 4 * b, &scale, sizeof(scale));
    }
    return absl::OkStatus();
  }

  // The CPU's own scale of x[0, len) (device memory), by PackSigns.
  static absl::StatusOr<float> HostScale(const float* x, size_t len) {
    std::vector<float> host(len);
    GC_RETURN_IF_ERROR(CopyToHost(x, absl::MakeSpan(host)));
    std::vector<char> signs(SignBytes(len));
    const double l1 = PackSigns(host, signs.data());
    return static_cast<float>(l1 / len);
  }

  const SignCodec::Variant variant_;
  const float momentum_;
  const size_t bucket_;
};

// 1-bit SGD (codecs/cpu/onebit.h), inside error feedback as on the CPU. The
// column sums run on the GPU in parallel (onebit.cu); a column's mean is the
// CPU's where it is the same at both ends of the sum's SumIntervalOf, as
// CudaSign settles its scales. Where a mean is not settled the CPU's own
// chains decide: for 64 columns or more a GPU thread per such column runs
// it, for fewer the host encodes the tensor with the CPU codec (their chains
// run through the whole tensor). The signs are the sign codecs' pack.
// The tensor is [rows, n / rows]: EncodeDevice treats it as 1-D (one
// column), Encode passes its shape's rows.
class CudaOneBit : public CudaCodec {
 public:
  explicit CudaOneBit(std::unique_ptr<SingleRoundCodec> cpu)
      : CudaCodec(std::move(cpu)) {}

  absl::Status EncodeDevice(const float* grad, size_t n, TensorState& state,
                            const StepContext& ctx,
                            Bytes* payload) const override {
    return EncodeDeviceRows(grad, n, static_cast<int64_t>(n), state, ctx,
                            payload);
  }

  absl::Status EncodeDeviceRows(const float* grad, size_t n, int64_t rows,
                                TensorState& state, const StepContext& ctx,
                                Bytes* payload) const override {
    GC_RETURN_IF_ERROR(CudaDeviceAvailable());
    GC_ASSIGN_OR_RETURN(const size_t columns, OneBitColumns(n, rows));
    char* body = BeginOneBitPayload(n, columns, payload);
    if (n == 0) return absl::OkStatus();
    GC_ASSIGN_OR_RETURN(DeviceBuffer sums,
                        DeviceBuffer::Create(3 * sizeof(double) * columns));
    GC_ASSIGN_OR_RETURN(DeviceBuffer scratch,
                        DeviceBuffer::Create(sizeof(double) *
                                             OneBitScratchDoubles(n, columns)));
    GC_ASSIGN_OR_RETURN(DeviceBuffer signs, DeviceBuffer::Create(SignBytes(n)));
    GC_ASSIGN_OR_RETURN(DeviceBuffer block_sums,
                        DeviceBuffer::Create(sizeof(double) * ((n + 63) / 64)));
    GC_CUDA_RETURN_IF_ERROR(LaunchOneBitColumnSums(
        grad, n, columns, scratch.as<double>(), sums.as<double>(), nullptr));
    GC_CUDA_RETURN_IF_ERROR(LaunchSignPack(grad, n, signs.data(),
                                           block_sums.as<double>(), nullptr));
    std::vector<double> host(3 * columns);
    GC_CUDA_RETURN_IF_ERROR(cudaMemcpy(host.data(), sums.data(),
                                       sizeof(double) * host.size(),
                                       cudaMemcpyDeviceToHost));
    GC_CUDA_RETURN_IF_ERROR(cudaMemcpy(body + 8 * columns, signs.data(),
                                       SignBytes(n), cudaMemcpyDeviceToHost));
    // A NaN or Inf term makes a sum non-finite in every order.
    for (const double sum : host) {
      if (!std::isfinite(sum)) {
        return absl::InvalidArgumentError(
            "onebit: the gradient holds NaN or Inf (a column's mean is not "
            "finite); expected finite values");
      }
    }
    std::vector<uint32_t> unsettled;
    const uint64_t chain = OneBitSumTerms(n, columns);
    for (size_t j = 0; j < columns; ++j) {
      if (!WriteMeans(host, j, columns, rows, chain, body)) {
        unsettled.push_back(static_cast<uint32_t>(j));
      }
    }
    if (unsettled.empty()) return absl::OkStatus();
    // Narrow columns' chains run through the chunks: the CPU codec encodes.
    if (OneBitScratchDoubles(n, columns) > 0) {
      return HostEncode(grad, n, rows, state, ctx, payload);
    }
    GC_ASSIGN_OR_RETURN(
        DeviceBuffer list,
        DeviceBuffer::Create(sizeof(uint32_t) * unsettled.size()));
    GC_CUDA_RETURN_IF_ERROR(cudaMemcpy(list.data(), unsettled.data(),
                                       sizeof(uint32_t) * unsettled.size(),
                                       cudaMemcpyHostToDevice));
    GC_CUDA_RETURN_IF_ERROR(
        LaunchOneBitExactColumns(grad, n, columns, list.as<uint32_t>(),
                                 unsettled.size(), sums.as<double>(), nullptr));
    GC_CUDA_RETURN_IF_ERROR(cudaMemcpy(host.data(), sums.data(),
                                       sizeof(double) * host.size(),
                                       cudaMemcpyDeviceToHost));
    for (const uint32_t j : unsettled) {
      WriteMeans(host, j, columns, rows, /*chain=*/0, body);
    }
    return absl::OkStatus();
  }

  absl::Status DecodeAddDevice(absl::string_view payload, float alpha,
                               float* acc, size_t n) const override {
    GC_ASSIGN_OR_RETURN(const OneBitPayload p, ParseOneBitPayload(payload, n));
    if (n == 0) return absl::OkStatus();
    const size_t columns = p.columns;
    // The means times alpha, then the signs, as one block for the device.
    std::string staged(p.means);
    staged.append(p.signs.data(), p.signs.size());
    for (size_t j = 0; j < 2 * columns; ++j) {
      float mean;
      std::memcpy(&mean, staged.data() + 4 * j, sizeof(mean));
      mean *= alpha;
      std::memcpy(staged.data() + 4 * j, &mean, sizeof(mean));
    }
    return DecodeWith(staged, [&](const char* block) {
      const float* means = reinterpret_cast<const float*>(block);
      return LaunchOneBitDecodeAdd(means, means + columns, columns,
                                   block + 8 * columns, n, acc, nullptr);
    });
  }

 private:
  // onebit.cc Encode's means of column j from its sums (host: positive,
  // negative, counts), into the body. With chain > 0 the sums are the CPU
  // chain's terms (chain of them at most) in another order: returns false,
  // writing nothing, where a mean is not the same at both ends of the sum's
  // interval. With chain 0 the sums are the CPU's own.
  static bool WriteMeans(const std::vector<double>& sums, size_t j,
                         size_t columns, int64_t rows, uint64_t chain,
                         char* body) {
    const double negatives = sums[2 * columns + j];
    const double others = static_cast<double>(rows) - negatives;
    const auto pos_of = [others](double sum) {
      return OneBitMean(sum, others);
    };
    const auto neg_of = [negatives](double sum) {
      return OneBitMean(sum, negatives);
    };
    float pos = pos_of(sums[j]);
    float neg = neg_of(sums[columns + j]);
    if (chain > 0) {
      // The negative side's sum negated: nonnegative terms.
      const SumInterval p = SumIntervalOf(
          sums[j], std::min<uint64_t>(chain, static_cast<uint64_t>(others)));
      const SumInterval q = SumIntervalOf(
          -sums[columns + j],
          std::min<uint64_t>(chain, static_cast<uint64_t>(negatives)));
      pos = pos_of(p.lo);
      neg = neg_of(-q.hi);
      if (pos != pos_of(p.hi) || neg != neg_of(-q.lo)) return false;
    }
    std::memcpy(body + 4 * j, &pos, sizeof(pos));
    std::memcpy(body + 4 * (columns + j), &neg, sizeof(neg));
    return true;
  }

  // The CPU codec's payload of the [rows, n / rows] tensor `grad` (device
  // memory): the path of a mean its interval does not settle.
  absl::Status HostEncode(const float* grad, size_t n, int64_t rows,
                          TensorState& state, const StepContext& ctx,
                          Bytes* payload) const {
    std::vector<float> values(n);
    GC_RETURN_IF_ERROR(CopyToHost(grad, absl::MakeSpan(values)));
    const std::vector<int64_t> shape = {
        rows, static_cast<int64_t>(n / static_cast<size_t>(rows))};
    payload->clear();
    return host_.Encode(TensorView{values, shape}, state, ctx, payload);
  }

  const OneBitCodec host_;
};

// TernGrad (codecs/cpu/terngrad.h). The clip c * sqrt(sum x^2 / n) needs
// SumOfSquares, a sequential double chain on the CPU: the GPU sums its
// terms in parallel and checks the interval as CudaSign does (the host
// runs SumOfSquares where the clip is not settled by it).
class CudaTernGrad : public CudaCodec {
 public:
  CudaTernGrad(std::unique_ptr<SingleRoundCodec> cpu, TernGradOptions options)
      : CudaCodec(std::move(cpu)), options_(options) {}

  absl::Status EncodeDevice(const float* grad, size_t n, TensorState& /*state*/,
                            const StepContext& ctx,
                            Bytes* payload) const override {
    GC_RETURN_IF_ERROR(CudaDeviceAvailable());
    const absl::Status non_finite = absl::InvalidArgumentError(
        "terngrad: the gradient holds NaN or Inf; expected finite values");
    float clip = std::numeric_limits<float>::infinity();
    if (options_.clip_sigma > 0 && n > 0) {
      GC_ASSIGN_OR_RETURN(const std::optional<float> c, Clip(grad, n));
      if (!c.has_value()) return non_finite;
      clip = *c;
    }
    const size_t bucket = static_cast<size_t>(options_.bucket);
    const size_t buckets = (n + bucket - 1) / bucket;
    char params[kTernParamBytes] = {};
    const uint32_t bucket32 = static_cast<uint32_t>(bucket);
    std::memcpy(params, &bucket32, sizeof(bucket32));
    WireHeader header;
    header.codec = CodecId::kTernGrad;
    header.numel = n;
    GC_ASSIGN_OR_RETURN(DeviceBuffer max_bits,
                        DeviceBuffer::Create(sizeof(uint32_t) * buckets));
    const PhiloxWords rng = ToPhiloxWords(WorkerStream(ctx, /*round=*/0));
    GC_ASSIGN_OR_RETURN(
        const bool bad,
        EncodeWith(
            header, absl::string_view(params, sizeof(params)),
            4 * buckets + (n + 3) / 4,
            [&](void* body, int* flag) {
              return LaunchTernGradEncode(
                  grad, n, bucket, clip, rng, max_bits.as<uint32_t>(),
                  static_cast<float*>(body),
                  static_cast<uint8_t*>(body) + 4 * buckets, flag, nullptr);
            },
            payload));
    if (bad) return non_finite;
    return absl::OkStatus();
  }

  absl::Status DecodeAddDevice(absl::string_view payload, float alpha,
                               float* acc, size_t n) const override {
    GC_ASSIGN_OR_RETURN(const TernGradPayload p,
                        ParseTernGradPayload(payload, n));
    return DecodeWith(p.body, [&](const char* body) {
      return LaunchTernGradDecodeAdd(
          reinterpret_cast<const float*>(body),
          reinterpret_cast<const uint8_t*>(body) + 4 * p.buckets, n, p.bucket,
          alpha, acc, nullptr);
    });
  }

 private:
  static constexpr size_t kTernParamBytes = 8;

  // The CPU's clip, or nullopt where its sum of squares is not finite.
  absl::StatusOr<std::optional<float>> Clip(const float* grad, size_t n) const {
    const size_t terms = n / 256 + 1;
    GC_ASSIGN_OR_RETURN(DeviceBuffer parts,
                        DeviceBuffer::Create(sizeof(double) * terms));
    GC_ASSIGN_OR_RETURN(DeviceBuffer total,
                        DeviceBuffer::Create(sizeof(double)));
    GC_CUDA_RETURN_IF_ERROR(
        LaunchSumOfSquaresTerms(grad, n, parts.as<double>(), nullptr));
    GC_CUDA_RETURN_IF_ERROR(LaunchSegmentSums(parts.as<double>(), terms, terms,
                                              total.as<double>(), nullptr));
    double sum = 0;
    GC_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(&sum, total.data(), sizeof(sum), cudaMemcpyDeviceToHost));
    const double c = options_.clip_sigma;
    const auto clip_of = [c, n](double sum_of_squares) {
      return static_cast<float>(c * std::sqrt(sum_of_squares / n));
    };
    // A sum that is not finite: NaN or Inf in the gradient, or an fp32 lane
    // that overflowed on finite values (above about 1.8e19), where the CPU's
    // SumOfSquares sums in double instead. The host's sum tells which.
    if (std::isfinite(sum)) {
      const SumInterval in = SumIntervalOf(sum, 8 * (n / 256) + n % 256);
      if (clip_of(in.lo) == clip_of(in.hi)) return clip_of(in.lo);
    }
    std::vector<float> host(n);
    GC_RETURN_IF_ERROR(CopyToHost(grad, absl::MakeSpan(host)));
    const double exact = SumOfSquares(host);
    if (!std::isfinite(exact)) return std::nullopt;
    return clip_of(exact);
  }

  const TernGradOptions options_;
};

// Random-k (codecs/cpu/randomk.h). The indices are drawn on the host
// (DrawRandomKBitmap: Floyd's algorithm is one sequential pass of k draws);
// the gather and the scatter-add run on the GPU.
class CudaRandomK : public CudaCodec {
 public:
  CudaRandomK(std::unique_ptr<RandomKCodec> cpu, const RandomKCodec* twin)
      : CudaCodec(std::move(cpu)), twin_(twin) {}

  absl::Status EncodeDevice(const float* grad, size_t n, TensorState& /*state*/,
                            const StepContext& ctx,
                            Bytes* payload) const override {
    GC_RETURN_IF_ERROR(CudaDeviceAvailable());
    GC_RETURN_IF_ERROR(CheckIndexable(n));
    const uint64_t k = twin_->KFor(n);
    const float scale = twin_->ScaleFor(n);
    const std::vector<uint32_t> indices = Indices(n, k, RandomKStream(ctx));
    GC_ASSIGN_OR_RETURN(DeviceBuffer device_indices,
                        DeviceBuffer::Create(sizeof(uint32_t) * k));
    if (k > 0) {
      GC_CUDA_RETURN_IF_ERROR(cudaMemcpy(device_indices.data(), indices.data(),
                                         sizeof(uint32_t) * k,
                                         cudaMemcpyHostToDevice));
    }
    GC_RETURN_IF_ERROR(
        EncodeWith([&] { return BeginRandomKPayload(n, k, ctx, payload); },
                   sizeof(float) * k,
                   [&](void* body, int*) {
                     return LaunchRandomKGather(
                         grad, device_indices.as<uint32_t>(), k, scale,
                         static_cast<float*>(body), nullptr);
                   })
            .status());
    // As the CPU twin: a value that is not finite is refused, not sent (the
    // body ends the payload).
    const char* values = payload->data() + payload->size() - sizeof(float) * k;
    for (uint64_t j = 0; j < k; ++j) {
      float value;
      std::memcpy(&value, values + sizeof(float) * j, sizeof(value));
      if (!std::isfinite(value)) {
        return RandomKNonFiniteValue(indices[j], value, scale);
      }
    }
    return absl::OkStatus();
  }

  absl::Status DecodeAddDevice(absl::string_view payload, float alpha,
                               float* acc, size_t n) const override {
    GC_ASSIGN_OR_RETURN(const RandomKPayload p,
                        ParseRandomKPayload(payload, n));
    const uint64_t k = p.k;
    GC_RETURN_IF_ERROR(CheckIndexable(n));
    GC_RETURN_IF_ERROR(CudaDeviceAvailable());
    const std::vector<uint32_t> indices = Indices(n, k, p.rng);
    // Indices, then values, as one block for the device.
    std::string staged(8 * k, '\0');
    if (k > 0) {
      std::memcpy(staged.data(), indices.data(), 4 * k);
      std::memcpy(staged.data() + 4 * k, p.values.data(), 4 * k);
    }
    return DecodeWith(staged, [&](const char* block) {
      return LaunchScatterAdd(reinterpret_cast<const uint32_t*>(block),
                              reinterpret_cast<const float*>(block + 4 * k), k,
                              alpha, acc, nullptr);
    });
  }

 private:
  static absl::Status CheckIndexable(size_t n) {
    if (n > std::numeric_limits<uint32_t>::max()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "randomk on the GPU: expected at most 2^32 - 1 elements (32-bit "
          "indices), got %d",
          n));
    }
    return absl::OkStatus();
  }

  // The drawn set, ascending: the CPU's order of the values.
  static std::vector<uint32_t> Indices(uint64_t n, uint64_t k,
                                       const PhiloxStream& rng) {
    const std::vector<uint64_t> bitmap = DrawRandomKBitmap(n, k, rng);
    std::vector<uint32_t> indices;
    indices.reserve(k);
    for (size_t w = 0; w < bitmap.size(); ++w) {
      for (uint64_t word = bitmap[w]; word != 0; word &= word - 1) {
        indices.push_back(
            static_cast<uint32_t>(w * 64 + __builtin_ctzll(word)));
      }
    }
    return indices;
  }

  const RandomKCodec* twin_;  // owned by CudaCodec
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

// signsgd, signum, efsign: the CPU codec checks the parameters; efsign
// comes wrapped in error feedback, on the GPU as on the CPU.
absl::StatusOr<std::unique_ptr<CudaCodec>> CreateSign(
    absl::string_view name, const CodecParams& params) {
  const SignCodec::Variant variant =
      name == "signsgd" ? SignCodec::Variant::kSignSgd
                        : (name == "signum" ? SignCodec::Variant::kSignum
                                            : SignCodec::Variant::kEfSign);
  GC_ASSIGN_OR_RETURN(std::unique_ptr<SingleRoundCodec> cpu,
                      SignCodec::Create(variant, params));
  GC_ASSIGN_OR_RETURN(const double momentum, params.GetDouble("momentum", 0.9));
  GC_ASSIGN_OR_RETURN(const int64_t bucket, params.GetInt("bucket", 0));
  if (variant == SignCodec::Variant::kSignum) {
    return std::unique_ptr<CudaCodec>(
        new CudaSign(std::move(cpu), variant, static_cast<float>(momentum), 0));
  }
  if (variant == SignCodec::Variant::kSignSgd) {
    return std::unique_ptr<CudaCodec>(
        new CudaSign(std::move(cpu), variant, 0.0f, 0));
  }
  auto inner = std::make_unique<CudaSign>(
      std::make_unique<SignCodec>(variant, 0.0f, bucket), variant, 0.0f,
      static_cast<size_t>(bucket));
  return std::unique_ptr<CudaCodec>(
      new CudaErrorFeedback(std::move(cpu), std::move(inner)));
}

// randomk, with error feedback when asked (codecs/cpu/randomk.cc
// RegisterRandomK).
absl::StatusOr<std::unique_ptr<CudaCodec>> CreateRandomK(
    const CodecParams& params) {
  GC_ASSIGN_OR_RETURN(const bool error_feedback,
                      params.GetBool("error_feedback", false));
  GC_ASSIGN_OR_RETURN(const RandomKOptions options,
                      RandomKCodec::ParseOptions(params, error_feedback));
  GC_RETURN_IF_ERROR(params.CheckAllUsed("randomk"));
  auto cpu = std::make_unique<RandomKCodec>(options);
  const RandomKCodec* twin = cpu.get();
  auto codec = std::make_unique<CudaRandomK>(std::move(cpu), twin);
  if (!error_feedback) return std::unique_ptr<CudaCodec>(std::move(codec));
  return std::unique_ptr<CudaCodec>(new CudaErrorFeedback(
      std::make_unique<ErrorFeedback>(std::make_unique<RandomKCodec>(options)),
      std::move(codec)));
}

}  // namespace

CudaCodec::CudaCodec(std::unique_ptr<SingleRoundCodec> cpu)
    : cpu_(std::move(cpu)) {}

absl::Status CudaCodec::Encode(const TensorView& grad, TensorState& state,
                               const StepContext& ctx, Bytes* payload) const {
  GC_RETURN_IF_ERROR(CudaDeviceAvailable());
  const size_t bytes = grad.numel() * sizeof(float);
  GC_ASSIGN_OR_RETURN(DeviceBuffer device, DeviceBuffer::Create(bytes));
  if (bytes > 0) {
    GC_CUDA_RETURN_IF_ERROR(cudaMemcpy(device.data(), grad.values.data(), bytes,
                                       cudaMemcpyHostToDevice));
  }
  return EncodeDeviceRows(device.as<float>(), grad.numel(), grad.rows(), state,
                          ctx, payload);
}

absl::Status CudaCodec::EncodeDeviceRows(const float* grad, size_t n,
                                         int64_t /*rows*/, TensorState& state,
                                         const StepContext& ctx,
                                         Bytes* payload) const {
  return EncodeDevice(grad, n, state, ctx, payload);
}

void CudaCodec::Revert(const TensorView& grad, TensorState& state,
                       const StepContext& ctx,
                       absl::string_view payload) const {
  cpu_->Revert(grad, state, ctx, payload);
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
  return {"none",    "fp16",   "bf16",   "int8",     "qsgd",   "topk",
          "signsgd", "signum", "efsign", "terngrad", "randomk"};
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
    const QsgdCodec* twin = cpu.get();
    return std::unique_ptr<CudaCodec>(new CudaQsgd(std::move(cpu), twin));
  }
  if (name == "topk") {
    GC_ASSIGN_OR_RETURN(std::unique_ptr<TopKCodec> cpu,
                        TopKCodec::Create(params));
    const TopKCodec* twin = cpu.get();
    return std::unique_ptr<CudaCodec>(new CudaTopK(std::move(cpu), twin));
  }
  if (name == "signsgd" || name == "signum" || name == "efsign") {
    return CreateSign(name, params);
  }
  if (name == "onebit") {
    GC_ASSIGN_OR_RETURN(std::unique_ptr<SingleRoundCodec> cpu,
                        OneBitCodec::Create(params));
    return std::unique_ptr<CudaCodec>(new CudaErrorFeedback(
        std::move(cpu),
        std::make_unique<CudaOneBit>(std::make_unique<OneBitCodec>())));
  }
  if (name == "terngrad") {
    GC_ASSIGN_OR_RETURN(std::unique_ptr<TernGradCodec> cpu,
                        TernGradCodec::Create(params));
    const TernGradOptions options = cpu->options();
    return std::unique_ptr<CudaCodec>(
        new CudaTernGrad(std::move(cpu), options));
  }
  if (name == "randomk") return CreateRandomK(params);
  return absl::NotFoundError(
      absl::StrFormat("no GPU encoder for codec '%s'; expected one of: %s",
                      name, absl::StrJoin(CudaCodecNames(), ", ")));
}

}  // namespace gradcomp::codecs::cuda
