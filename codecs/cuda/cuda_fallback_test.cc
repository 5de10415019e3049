// What the GPU codecs do where no GPU answers (every developer and CI machine
// here): say so with Unavailable, never crash, and check parameters exactly
// as the CPU codecs do.
#include <memory>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "codecs/codec.h"
#include "codecs/cpu/dense.h"
#include "codecs/cpu/int8.h"
#include "codecs/cpu/onebit.h"
#include "codecs/cpu/qsgd.h"
#include "codecs/cpu/randomk.h"
#include "codecs/cpu/sign.h"
#include "codecs/cpu/terngrad.h"
#include "codecs/cpu/topk.h"
#include "codecs/cuda/cuda_codec.h"
#include "codecs/cuda/device.h"
#include "codecs/params.h"
#include "codecs/registry.h"
#include "codecs/state.h"
#include "gtest/gtest.h"

namespace gradcomp::codecs::cuda {
namespace {

TEST(CudaFallbackTest, EncodeIsUnavailableWithoutAGpu) {
  const absl::Status gpu = CudaDeviceAvailable();
  if (gpu.ok()) GTEST_SKIP() << "a GPU answered; the fallback is not taken";
  EXPECT_EQ(gpu.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(gpu.message().find("no usable CUDA device"),
            absl::string_view::npos)
      << gpu.message();
  const std::vector<float> values(100, 1.0f);
  const std::vector<int64_t> shape = {100};
  for (const std::string& name : CudaCodecNames()) {
    absl::StatusOr<std::unique_ptr<CudaCodec>> codec =
        CreateCudaCodec(name, CodecParams());
    ASSERT_TRUE(codec.ok()) << name << ": " << codec.status();
    TensorState state;
    Bytes payload;
    const absl::Status s = (*codec)->Encode(TensorView{values, shape}, state,
                                            StepContext{}, &payload);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << name << ": " << s;
    // Top-k's momentum and velocity are not touched by a failed encode.
    EXPECT_EQ(state.ByteSize(), 0u) << name;
  }
}

std::unique_ptr<SingleRoundCodec> CpuCodec(const std::string& name) {
  CodecRegistry registry;
  EXPECT_TRUE(RegisterDenseCodecs(registry).ok());
  EXPECT_TRUE(RegisterInt8(registry).ok());
  EXPECT_TRUE(RegisterQsgd(registry).ok());
  EXPECT_TRUE(RegisterTopK(registry).ok());
  EXPECT_TRUE(RegisterSignCodecs(registry).ok());
  EXPECT_TRUE(RegisterOneBit(registry).ok());
  EXPECT_TRUE(RegisterTernGrad(registry).ok());
  EXPECT_TRUE(RegisterRandomK(registry).ok());
  std::unique_ptr<Codec> codec = registry.Create(name, CodecParams()).value();
  return std::unique_ptr<SingleRoundCodec>(
      dynamic_cast<SingleRoundCodec*>(codec.release()));
}

Bytes CpuPayload(const std::string& name, const std::vector<float>& values) {
  const std::vector<int64_t> shape = {static_cast<int64_t>(values.size())};
  TensorState state;
  StepContext ctx;
  ctx.world_size = 2;
  Bytes payload;
  EXPECT_TRUE(CpuCodec(name)
                  ->Encode(TensorView{values, shape}, state, ctx, &payload)
                  .ok());
  return payload;
}

TEST(CudaFallbackTest, DecodeIsUnavailableWithoutAGpu) {
  if (CudaDeviceAvailable().ok()) GTEST_SKIP() << "a GPU answered";
  const std::vector<float> values(100, 1.0f);
  for (const std::string& name : CudaCodecNames()) {
    std::unique_ptr<CudaCodec> codec =
        CreateCudaCodec(name, CodecParams()).value();
    // No GPU: the accumulator is never touched, so none is needed.
    const absl::Status s = codec->DecodeAddDevice(CpuPayload(name, values),
                                                  1.0f, nullptr, values.size());
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << name << ": " << s;
  }
}

// `payload` with bytes [at, at + size) set to `value` (the header is 32
// bytes, the 8-byte parameter block follows, then the body).
Bytes With(Bytes payload, size_t at, size_t size, char value) {
  for (size_t i = at; i < at + size; ++i) payload[i] = value;
  return payload;
}

// Payloads each CPU decoder rejects, one fault each.
std::vector<Bytes> BadPayloads(const std::string& name, const Bytes& good) {
  std::vector<Bytes> bad = {
      Bytes(good.begin(), good.end() - 1),        // truncated
      With(good, 5, 1, static_cast<char>(0x7F)),  // another codec id
      With(good, 7, 1, good[7] == 0 ? 1 : 0),     // dense flag flipped
  };
  if (name == "int8" || name == "qsgd") {
    bad.push_back(With(good, 32, 4, 0));  // bucket 0
    bad.push_back(With(good, 35, 1, 1));  // bucket over 2^20
    bad.push_back(With(good, 36, 1, 9));  // rounding 9 / 9 bits
    bad.push_back(With(good, 37, 1, 1));  // reserved parameter byte
    bad.push_back(With(good, 40, 4, static_cast<char>(0xFF)));  // NaN table
  } else if (name == "topk") {
    bad.push_back(With(good, 32, 1, 9));  // index encoding
    bad.push_back(With(good, 33, 1, 1));  // padding
    bad.push_back(With(good, 36, 4, static_cast<char>(0xFF)));  // count > n
  } else if (name == "signsgd" || name == "signum" || name == "efsign") {
    // No parameter block: the body's scale at 32, then 16 words of signs.
    bad.push_back(With(good, 32, 4, static_cast<char>(0xFF)));  // NaN scale
    bad.push_back(With(good, 35, 1, static_cast<char>(0xBF)));  // scale < 0
    bad.push_back(With(good, 36 + 8 * 15 + 7, 1, 1));           // a padding bit
  } else if (name == "onebit") {
    // One column (a 1-D tensor): its two means at 40 and 44, signs from 48.
    bad.push_back(With(good, 32, 1, 0));  // 0 columns
    bad.push_back(With(good, 32, 1, 3));  // 3 columns do not divide 1000
    bad.push_back(With(good, 40, 4, static_cast<char>(0xFF)));  // NaN mean
    bad.push_back(With(good, 47, 1, 0x3F));     // a positive negative mean
    bad.push_back(With(good, 48 + 127, 1, 1));  // a padding bit
  } else if (name == "terngrad") {
    // Two buckets of 512: scales at 40 and 44, codes from 48.
    bad.push_back(With(good, 32, 4, 0));  // bucket 0
    bad.push_back(With(good, 36, 1, 1));  // reserved parameter byte
    bad.push_back(With(good, 44, 4, static_cast<char>(0xFF)));  // NaN scale
    bad.push_back(With(good, 48, 1, static_cast<char>(0xFF)));  // code 3
  } else if (name == "randomk") {
    bad.push_back(With(good, 32, 1, 9));  // element type
    bad.push_back(With(good, 33, 1, 7));  // index draw
    bad.push_back(With(good, 34, 1, 1));  // reserved parameter byte
    bad.push_back(With(good, 44, 1, 1));  // k > n
  } else {
    bad.push_back(With(good, 32, 1, 9));  // element type
    bad.push_back(With(good, 33, 1, 1));  // reserved parameter byte
    bad.push_back(With(good, 36, 4, 0));  // divisor 0
  }
  if (name == "qsgd") bad.push_back(With(good, 36, 1, 1));  // 1 bit
  return bad;
}

// Checked before the GPU is asked for, so with or without one: every
// payload the CPU decoder rejects, the GPU decoder rejects too, and the
// accumulator is never touched (it is null here).
TEST(CudaFallbackTest, DecodeRejectsWhatTheCpuRejects) {
  const std::vector<float> values(1000, 0.5f);
  for (const std::string& name : CudaCodecNames()) {
    const Bytes good = CpuPayload(name, values);
    const std::vector<Bytes> bad = BadPayloads(name, good);
    std::unique_ptr<CudaCodec> gpu =
        CreateCudaCodec(name, CodecParams()).value();
    std::unique_ptr<SingleRoundCodec> cpu = CpuCodec(name);
    for (size_t i = 0; i < bad.size(); ++i) {
      std::vector<float> acc(values.size(), 0.0f);
      const absl::Status on_cpu =
          cpu->DecodeAdd(bad[i], 1.0f, absl::MakeSpan(acc));
      const absl::Status on_gpu =
          gpu->DecodeAddDevice(bad[i], 1.0f, nullptr, values.size());
      EXPECT_EQ(on_cpu.code(), absl::StatusCode::kInvalidArgument)
          << name << " case " << i << ": " << on_cpu;
      EXPECT_EQ(on_gpu.code(), absl::StatusCode::kInvalidArgument)
          << name << " case " << i << ": " << on_gpu;
      // These decoders share the CPU's parse function (codecs/cpu).
      if (name == "int8" || name == "qsgd" || name == "none" ||
          name == "fp16" || name == "bf16" || name == "signsgd" ||
          name == "signum" || name == "efsign" || name == "onebit" ||
          name == "terngrad" || name == "randomk") {
        EXPECT_EQ(on_gpu.message(), on_cpu.message()) << name << " case " << i;
      }
    }
    // A payload for another tensor size.
    EXPECT_EQ(
        gpu->DecodeAddDevice(good, 1.0f, nullptr, values.size() + 1).code(),
        absl::StatusCode::kInvalidArgument)
        << name;
  }
}

TEST(CudaFallbackTest, InfoIsTheCpuCodecs) {
  for (const std::string& name : CudaCodecNames()) {
    std::unique_ptr<CudaCodec> codec =
        CreateCudaCodec(name, CodecParams()).value();
    EXPECT_EQ(codec->info().name, name);
  }
}

TEST(CudaFallbackTest, BadParametersAreRejectedAsOnCpu) {
  EXPECT_EQ(
      CreateCudaCodec("qsgd", CodecParams({{"bits", "9"}})).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      CreateCudaCodec("int8", CodecParams({{"bucket", "0"}})).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      CreateCudaCodec("fp16", CodecParams({{"colour", "red"}})).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      CreateCudaCodec("topk", CodecParams({{"ratio", "0"}})).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateCudaCodec("signum", CodecParams({{"momentum", "1"}}))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateCudaCodec("efsign", CodecParams({{"bucket", "65"}}))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateCudaCodec("signsgd", CodecParams({{"momentum", "0.5"}}))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateCudaCodec("onebit", CodecParams({{"bucket", "64"}}))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateCudaCodec("terngrad", CodecParams({{"clip_sigma", "-1"}}))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateCudaCodec("randomk", CodecParams({{"error_feedback", "true"},
                                                    {"scale", "true"}}))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CudaFallbackTest, CodecsWithoutAGpuEncoderAreNotFound) {
  const absl::Status s = CreateCudaCodec("powersgd", CodecParams()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.message().find("qsgd"), absl::string_view::npos) << s.message();
}

}  // namespace
}  // namespace gradcomp::codecs::cuda
