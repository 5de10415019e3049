#include "codecs/cuda/cuda_codec.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "codecs/cpu/dense.h"
#include "codecs/cpu/int8.h"
#include "codecs/cpu/kernels.h"
#include "codecs/cpu/qsgd.h"
#include "codecs/cpu/select.h"
#include "codecs/cpu/topk.h"
#include "codecs/cuda/decode.h"
#include "codecs/cuda/device.h"
#include "codecs/cuda/kernels.h"
#include "codecs/cuda/philox_words.h"
#include "codecs/cuda/select.h"
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
  GC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(nullptr));
  return absl::OkStatus();
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
    GC_ASSIGN_OR_RETURN(const ParsedPayload parsed,
                        ParsePayload(payload, info().id, /*round=*/0, n));
    GC_ASSIGN_OR_RETURN(const uint32_t divisor, ParseDivisor(parsed));
    GC_ASSIGN_OR_RETURN(const size_t elements, DenseBodyElements(parsed));
    if (elements != n) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s payload: expected a dense body of %d elements, got %d bytes",
          info().name, n, parsed.body.size()));
    }
    // The CPU's scale: alpha * divisor, rounded to fp32 on the host.
    const float scale = alpha * static_cast<float>(divisor);
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
  absl::StatusOr<uint32_t> ParseDivisor(const ParsedPayload& parsed) const {
    const absl::string_view p = parsed.params;
    if (p.size() != kDenseParamBytes ||
        static_cast<uint8_t>(p[0]) != static_cast<uint8_t>(type_) ||
        p[1] != 0 || p[2] != 0 || p[3] != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s payload: expected %d parameter bytes: element type %d, three "
          "zero bytes, the divisor",
          info().name, kDenseParamBytes, static_cast<int>(type_)));
    }
    uint32_t divisor;
    std::memcpy(&divisor, p.data() + 4, sizeof(divisor));
    if (divisor == 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s payload: expected a prescale divisor >= 1, got 0", info().name));
    }
    return divisor;
  }

  const ElemType type_;
  const bool prescale_;
};

// int8 and qsgd payloads: header flags 0 and an 8-byte parameter block of
// the u32 bucket, one option byte (int8: rounding, qsgd: bits) and three
// zero bytes; the body is a per-bucket table, then the codes.
constexpr uint32_t kMaxBucket = uint32_t{1} << 20;  // as codecs/cpu
constexpr size_t kBucketedParamBytes = 8;

struct BucketedPayload {
  size_t bucket;
  uint8_t option;
  absl::string_view body;
};

// The checks the CPU decoders make of a bucketed payload's head.
absl::StatusOr<BucketedPayload> ParseBucketed(absl::string_view payload,
                                              CodecId id, const char* name,
                                              size_t n) {
  GC_ASSIGN_OR_RETURN(const ParsedPayload parsed,
                      ParsePayload(payload, id, /*round=*/0, n));
  if (parsed.header.flags != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: expected header flags 0 (not a dense body), got 0x%02x", name,
        parsed.header.flags));
  }
  if (parsed.params.size() != kBucketedParamBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: expected %d parameter bytes, got %d", name,
                        kBucketedParamBytes, parsed.params.size()));
  }
  const char* p = parsed.params.data();
  uint32_t bucket;
  std::memcpy(&bucket, p, sizeof(bucket));
  if (bucket < 1 || bucket > kMaxBucket) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: payload bucket must be in [1, %d]; got %d", name,
                        kMaxBucket, bucket));
  }
  if (p[5] != 0 || p[6] != 0 || p[7] != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: expected parameter bytes 5..7 to be zero", name));
  }
  return BucketedPayload{bucket, static_cast<uint8_t>(p[4]), parsed.body};
}

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
    GC_ASSIGN_OR_RETURN(const BucketedPayload p,
                        ParseBucketed(payload, CodecId::kInt8, "int8", n));
    if (p.option > 1) {
      return absl::InvalidArgumentError(
          absl::StrFormat("int8: expected rounding 0 or 1, got %d", p.option));
    }
    const size_t buckets = (n + p.bucket - 1) / p.bucket;
    if (p.body.size() != 8 * buckets + n) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "int8: %d elements in buckets of %d need a body of %d bytes, got %d",
          n, p.bucket, 8 * buckets + n, p.body.size()));
    }
    for (size_t b = 0; b < buckets; ++b) {
      float lo, hi;
      std::memcpy(&lo, p.body.data() + 8 * b, 4);
      std::memcpy(&hi, p.body.data() + 8 * b + 4, 4);
      if (!std::isfinite(lo) || !std::isfinite(hi) || !(lo <= hi)) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "int8: bucket %d has min %g and max %g; expected finite min <= max",
            b, lo, hi));
      }
    }
    return DecodeWith(p.body, [&](const char* body) {
      return LaunchInt8DecodeAdd(
          body, reinterpret_cast<const uint8_t*>(body) + 8 * buckets, n,
          p.bucket, alpha, acc, nullptr);
    });
  }

 private:
  const Int8Options options_;
};

class CudaQsgd : public CudaCodec {
 public:
  CudaQsgd(std::unique_ptr<SingleRoundCodec> cpu, QsgdOptions options)
      : CudaCodec(std::move(cpu)), options_(options) {}

  absl::Status EncodeDevice(const float* grad, size_t n, TensorState& /*state*/,
                            const StepContext& ctx,
                            Bytes* payload) const override {
    const size_t bucket = static_cast<size_t>(options_.bucket);
    const int bits = options_.bits;
    return EncodeBucketed(
        CodecId::kQsgd, bucket, static_cast<uint8_t>(bits), n,
        4 * ((n + bucket - 1) / bucket), (n * bits + 7) / 8, ctx,
        "qsgd: the gradient holds NaN or Inf (a bucket's norm is not "
        "finite); expected finite values",
        [&](const PhiloxWords& rng, void* norms, uint8_t* codes, int* flag) {
          return LaunchQsgdEncode(grad, n, bucket, bits, rng, norms, codes,
                                  flag, nullptr);
        },
        payload);
  }

  absl::Status DecodeAddDevice(absl::string_view payload, float alpha,
                               float* acc, size_t n) const override {
    GC_ASSIGN_OR_RETURN(const BucketedPayload p,
                        ParseBucketed(payload, CodecId::kQsgd, "qsgd", n));
    const int bits = p.option;
    if (bits < 2 || bits > 8) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "qsgd: payload bits must be in [2, 8]; got %d", bits));
    }
    const size_t buckets = (n + p.bucket - 1) / p.bucket;
    const size_t code_bytes = (n * bits + 7) / 8;
    if (p.body.size() != 4 * buckets + code_bytes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "qsgd: %d elements in buckets of %d at %d bits need a body of %d "
          "bytes, got %d",
          n, p.bucket, bits, 4 * buckets + code_bytes, p.body.size()));
    }
    for (size_t b = 0; b < buckets; ++b) {
      float norm;
      std::memcpy(&norm, p.body.data() + 4 * b, sizeof(norm));
      if (!(norm >= 0) || !std::isfinite(norm)) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "qsgd: bucket %d has norm %g; expected a finite value >= 0", b,
            norm));
      }
    }
    const uint8_t* codes =
        reinterpret_cast<const uint8_t*>(p.body.data()) + 4 * buckets;
    const int tail_bits = static_cast<int>((n * bits) % 8);
    if (tail_bits != 0 && (codes[code_bytes - 1] >> tail_bits) != 0) {
      return absl::InvalidArgumentError(
          "qsgd: expected the padding bits of the last code byte to be zero");
    }
    return DecodeWith(p.body, [&](const char* body) {
      return LaunchQsgdDecodeAdd(
          body, reinterpret_cast<const uint8_t*>(body) + 4 * buckets, n,
          p.bucket, bits, alpha, acc, nullptr);
    });
  }

 private:
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
    GC_ASSIGN_OR_RETURN(const TopKPairs pairs, ParseTopKPayload(payload, n));
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

absl::Status CudaCodec::Encode(const TensorView& grad, TensorState& state,
                               const StepContext& ctx, Bytes* payload) const {
  GC_RETURN_IF_ERROR(CudaDeviceAvailable());
  const size_t bytes = grad.numel() * sizeof(float);
  GC_ASSIGN_OR_RETURN(DeviceBuffer device, DeviceBuffer::Create(bytes));
  if (bytes > 0) {
    GC_CUDA_RETURN_IF_ERROR(cudaMemcpy(device.data(), grad.values.data(), bytes,
                                       cudaMemcpyHostToDevice));
  }
  return EncodeDevice(device.as<float>(), grad.numel(), state, ctx, payload);
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
  return {"none", "fp16", "bf16", "int8", "qsgd", "topk"};
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
  if (name == "topk") {
    GC_ASSIGN_OR_RETURN(std::unique_ptr<TopKCodec> cpu,
                        TopKCodec::Create(params));
    const TopKCodec* twin = cpu.get();
    return std::unique_ptr<CudaCodec>(new CudaTopK(std::move(cpu), twin));
  }
  return absl::NotFoundError(
      absl::StrFormat("no GPU encoder for codec '%s'; expected one of: %s",
                      name, absl::StrJoin(CudaCodecNames(), ", ")));
}

}  // namespace gradcomp::codecs::cuda
