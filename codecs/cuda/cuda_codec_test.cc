// GPU encoders against the CPU codecs: the same payload bytes for the same
// input, seed, rank and step. Needs a GPU; skips (never passes) without one.
#include "codecs/cuda/cuda_codec.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "codecs/codec.h"
#include "codecs/cpu/dense.h"
#include "codecs/cpu/int8.h"
#include "codecs/cpu/qsgd.h"
#include "codecs/cuda/device.h"
#include "codecs/params.h"
#include "codecs/registry.h"
#include "codecs/state.h"
#include "gtest/gtest.h"

namespace gradcomp::codecs::cuda {
namespace {

std::vector<float> Normal(size_t n, uint32_t seed, float stddev) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

// The first differing byte, for a readable failure.
std::string Diff(const Bytes& cpu, const Bytes& gpu) {
  if (cpu.size() != gpu.size()) {
    return absl::StrFormat("sizes differ: CPU %d bytes, GPU %d", cpu.size(),
                           gpu.size());
  }
  for (size_t i = 0; i < cpu.size(); ++i) {
    if (cpu[i] != gpu[i]) {
      return absl::StrFormat(
          "first difference at byte %d of %d: CPU 0x%02x, GPU 0x%02x", i,
          cpu.size(), static_cast<uint8_t>(cpu[i]),
          static_cast<uint8_t>(gpu[i]));
    }
  }
  return "identical";
}

std::unique_ptr<SingleRoundCodec> CpuCodec(const std::string& name,
                                           const CodecParams& params) {
  if (name == "int8") return Int8Codec::Create(params).value();
  if (name == "qsgd") return QsgdCodec::Create(params).value();
  CodecRegistry registry;
  EXPECT_TRUE(RegisterDenseCodecs(registry).ok());
  std::unique_ptr<Codec> codec = registry.Create(name, params).value();
  return std::unique_ptr<SingleRoundCodec>(
      dynamic_cast<SingleRoundCodec*>(codec.release()));
}

class CudaCodecTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const absl::Status gpu = CudaDeviceAvailable();
    if (!gpu.ok()) GTEST_SKIP() << gpu.message();
  }

  // Encodes `values` on both backends and expects the same bytes.
  void ExpectSameBytes(const std::string& name, const CodecParams& params,
                       const std::vector<float>& values,
                       const StepContext& ctx) {
    const std::vector<int64_t> shape = {static_cast<int64_t>(values.size())};
    const TensorView view{values, shape};
    TensorState cpu_state, gpu_state;
    Bytes cpu_payload, gpu_payload;
    ASSERT_TRUE(CpuCodec(name, params)
                    ->Encode(view, cpu_state, ctx, &cpu_payload)
                    .ok());
    absl::StatusOr<std::unique_ptr<CudaCodec>> gpu =
        CreateCudaCodec(name, params);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    const absl::Status encoded =
        (*gpu)->Encode(view, gpu_state, ctx, &gpu_payload);
    ASSERT_TRUE(encoded.ok()) << encoded;
    EXPECT_TRUE(cpu_payload == gpu_payload)
        << name << " n=" << values.size() << ": "
        << Diff(cpu_payload, gpu_payload);
  }
};

const size_t kSizes[] = {0, 1, 7, 8, 9, 1000, 4099, (size_t{1} << 20) + 3};

StepContext Context(int rank) {
  StepContext ctx;
  ctx.seed = 1234;
  ctx.tensor_id = 77;
  ctx.step = 5;
  ctx.rank = rank;
  ctx.world_size = 4;
  return ctx;
}

TEST_F(CudaCodecTest, DenseCastsMatchCpu) {
  for (const char* name : {"none", "fp16", "bf16"}) {
    for (const char* prescale : {"false", "true"}) {
      for (size_t n : kSizes) {
        ExpectSameBytes(name, CodecParams({{"prescale", prescale}}),
                        Normal(n, 11, 1.0f), Context(0));
      }
    }
  }
}

TEST_F(CudaCodecTest, HalfSpecialValuesMatchCpu) {
  // NaNs with payloads, infinities, the fp16 overflow edge, subnormals of
  // both formats, signed zeros, and ties at every rounding boundary.
  std::vector<float> v = {0.0f,
                          -0.0f,
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          65504.0f,
                          65519.99f,
                          65520.0f,
                          -65520.0f,
                          1e-8f,
                          -3e-8f,
                          5.960464477539063e-8f,
                          2.98e-8f,
                          6.1e-5f,
                          1e-40f,
                          std::numeric_limits<float>::denorm_min(),
                          std::numeric_limits<float>::max()};
  for (uint32_t payload :
       {0x7FC00000u, 0x7F800001u, 0xFFA5A5A5u, 0x7FFFFFFFu, 0x7F802000u}) {
    float f;
    std::memcpy(&f, &payload, sizeof(f));
    v.push_back(f);
  }
  // Every 16-bit pattern's midpoint neighbourhood: exact ties round to even.
  for (uint32_t bits = 0x33000000u; bits < 0x47800000u; bits += 0x1000u - 1) {
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    v.push_back(f);
    v.push_back(-f);
  }
  for (const char* name : {"none", "fp16", "bf16"}) {
    for (const char* prescale : {"false", "true"}) {
      ExpectSameBytes(name, CodecParams({{"prescale", prescale}}), v,
                      Context(0));
    }
  }
}

TEST_F(CudaCodecTest, Int8MatchesCpu) {
  for (const char* stochastic : {"false", "true"}) {
    for (const char* bucket : {"1", "7", "1024", "5000"}) {
      for (size_t n : kSizes) {
        for (int rank : {0, 3}) {
          ExpectSameBytes(
              "int8",
              CodecParams({{"bucket", bucket}, {"stochastic", stochastic}}),
              Normal(n, 21 + rank, 0.01f), Context(rank));
        }
      }
    }
  }
}

TEST_F(CudaCodecTest, Int8SignedZerosMatchCpu) {
  // The min and max of a bucket of zeros: the CPU keeps the first of -0/+0.
  std::vector<float> v = {0.0f, -0.0f, 0.0f, 1.0f, -0.0f, 0.0f, -0.0f, -0.0f};
  for (const char* bucket : {"2", "3", "8"}) {
    ExpectSameBytes("int8", CodecParams({{"bucket", bucket}}), v, Context(0));
  }
}

TEST_F(CudaCodecTest, QsgdMatchesCpu) {
  for (const char* bits : {"2", "3", "4", "5", "8"}) {
    for (const char* bucket : {"1", "7", "512", "3000"}) {
      for (size_t n : kSizes) {
        for (int rank : {0, 2}) {
          ExpectSameBytes("qsgd",
                          CodecParams({{"bits", bits}, {"bucket", bucket}}),
                          Normal(n, 31 + rank, 0.01f), Context(rank));
        }
      }
    }
  }
}

TEST_F(CudaCodecTest, QsgdZeroBucketsMatchCpu) {
  std::vector<float> v(4096, 0.0f);
  for (size_t i = 2048; i < v.size(); ++i) v[i] = (i % 3 == 0) ? -0.5f : 0.25f;
  v[100] = -0.0f;
  ExpectSameBytes("qsgd", CodecParams({{"bucket", "512"}}), v, Context(1));
}

TEST_F(CudaCodecTest, NonFiniteInputIsInvalidArgument) {
  std::vector<float> v = Normal(3000, 5, 1.0f);
  v[1500] = std::numeric_limits<float>::quiet_NaN();
  const std::vector<int64_t> shape = {3000};
  TensorState state;
  for (const char* name : {"int8", "qsgd"}) {
    std::unique_ptr<CudaCodec> codec =
        CreateCudaCodec(name, CodecParams()).value();
    Bytes payload;
    const absl::Status s =
        codec->Encode(TensorView{v, shape}, state, Context(0), &payload);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument)
        << name << ": " << s;
  }
}

TEST_F(CudaCodecTest, GpuPayloadDecodesOnCpu) {
  const std::vector<float> v = Normal(10000, 9, 1.0f);
  const std::vector<int64_t> shape = {10000};
  TensorState state;
  std::unique_ptr<CudaCodec> gpu =
      CreateCudaCodec("fp16", CodecParams()).value();
  Bytes payload;
  ASSERT_TRUE(
      gpu->Encode(TensorView{v, shape}, state, Context(0), &payload).ok());
  std::vector<float> decoded(v.size(), 0.0f);
  ASSERT_TRUE(CpuCodec("fp16", CodecParams())
                  ->DecodeAdd(payload, 1.0f, absl::MakeSpan(decoded))
                  .ok());
  for (size_t i = 0; i < v.size(); ++i) {
    // fp16 keeps 11 significant bits: relative error <= 2^-11.
    EXPECT_NEAR(decoded[i], v[i], std::fabs(v[i]) * (1.0f / 2048) + 1e-7f) << i;
  }
}

}  // namespace
}  // namespace gradcomp::codecs::cuda
