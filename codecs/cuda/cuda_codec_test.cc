// GPU encoders and decoders against the CPU codecs: the same payload bytes
// for the same input, seed, rank and step, and the same sums, bit for bit,
// whichever side encoded and whichever decodes. Needs a GPU; skips (never
// passes) without one.
#include "codecs/cuda/cuda_codec.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "absl/types/span.h"
#include "codecs/codec.h"
#include "codecs/cpu/dense.h"
#include "codecs/cpu/int8.h"
#include "codecs/cpu/qsgd.h"
#include "codecs/cpu/topk.h"
#include "codecs/cuda/gpu_test_util.h"
#include "codecs/params.h"
#include "codecs/registry.h"
#include "codecs/state.h"
#include "codecs/testing/random_inputs.h"
#include "gtest/gtest.h"

namespace gradcomp::codecs::cuda {
namespace {

using testing::Normal;

// The first element whose bits differ, for a readable failure.
std::string FloatDiff(const std::vector<float>& cpu,
                      const std::vector<float>& gpu) {
  if (cpu.size() != gpu.size()) {
    return absl::StrFormat("sizes differ: CPU %d, GPU %d", cpu.size(),
                           gpu.size());
  }
  for (size_t i = 0; i < cpu.size(); ++i) {
    uint32_t a, b;
    std::memcpy(&a, &cpu[i], 4);
    std::memcpy(&b, &gpu[i], 4);
    if (a != b) {
      return absl::StrFormat(
          "first difference at element %d of %d: CPU %.9g (0x%08x), GPU %.9g "
          "(0x%08x)",
          i, cpu.size(), cpu[i], a, gpu[i], b);
    }
  }
  return "identical";
}

std::unique_ptr<SingleRoundCodec> CpuCodec(const std::string& name,
                                           const CodecParams& params) {
  if (name == "int8") return Int8Codec::Create(params).value();
  if (name == "qsgd") return QsgdCodec::Create(params).value();
  if (name == "topk") return TopKCodec::Create(params).value();
  CodecRegistry registry;
  EXPECT_TRUE(RegisterDenseCodecs(registry).ok());
  std::unique_ptr<Codec> codec = registry.Create(name, params).value();
  return std::unique_ptr<SingleRoundCodec>(
      dynamic_cast<SingleRoundCodec*>(codec.release()));
}

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

class CudaCodecTest : public GpuTest {
 protected:
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
        << PayloadDiff(cpu_payload, gpu_payload);
  }

  // Encodes `values` on `encoder_on_gpu`'s side, then decodes the payload
  // on both sides into the same nonzero accumulator with `alpha`, and
  // expects the same bits.
  void ExpectSameSums(const std::string& name, const CodecParams& params,
                      const std::vector<float>& values, bool encode_on_gpu,
                      float alpha) {
    const std::vector<int64_t> shape = {static_cast<int64_t>(values.size())};
    const TensorView view{values, shape};
    const StepContext ctx = Context(1);
    std::unique_ptr<SingleRoundCodec> cpu = CpuCodec(name, params);
    absl::StatusOr<std::unique_ptr<CudaCodec>> gpu =
        CreateCudaCodec(name, params);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    TensorState state;
    Bytes payload;
    const absl::Status encoded =
        encode_on_gpu ? (*gpu)->Encode(view, state, ctx, &payload)
                      : cpu->Encode(view, state, ctx, &payload);
    ASSERT_TRUE(encoded.ok()) << encoded;
    const std::vector<float> acc = Normal(values.size(), 99, 0.5f);
    std::vector<float> cpu_sum = acc;
    const absl::Status decoded =
        cpu->DecodeAdd(payload, alpha, absl::MakeSpan(cpu_sum));
    ASSERT_TRUE(decoded.ok()) << decoded;
    absl::StatusOr<std::vector<float>> gpu_sum =
        GpuDecodeAdd(**gpu, payload, alpha, acc);
    ASSERT_TRUE(gpu_sum.ok()) << gpu_sum.status();
    EXPECT_TRUE(SameBits(cpu_sum, *gpu_sum))
        << name << " n=" << values.size() << " alpha=" << alpha
        << (encode_on_gpu ? " (GPU" : " (CPU")
        << " payload): " << FloatDiff(cpu_sum, *gpu_sum);
  }
};

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

TEST_F(CudaCodecTest, QsgdOfValuesWhoseSquaresOverflowMatchesCpu) {
  // 2e19^2 overflows the fp32 sum of a bucket's squares; the CPU's norm
  // falls back to a double sum (kernels.h BucketNorm), and so does the GPU
  // twin, by encoding such a tensor on the host.
  std::vector<float> v = Normal(4099, 8, 1.0f);
  v[700] = 2e19f;
  v[3000] = -3e38f;
  ExpectSameBytes("qsgd", CodecParams({{"bucket", "512"}}), v, Context(1));
}

TEST_F(CudaCodecTest, QsgdOfTinyValuesMatchesCpu) {
  // Normal floats near 1e-25: their fp32 squares underflow, so the CPU's
  // BucketNorm sums such a bucket in double (kTinySumOfSquares), and the
  // GPU twin encodes the tensor on the host. A bucket of zeros stays on the
  // GPU, and a tiny bucket beside ordinary ones is found by both kernels
  // (bucket 512: the one-pass kernel; 100: the two-pass one).
  std::vector<float> tiny = Normal(4099, 9, 1e-25f);
  std::vector<float> mixed = Normal(4099, 10, 1.0f);
  for (size_t i = 1024; i < 1536; ++i) mixed[i] = tiny[i];
  for (size_t i = 2048; i < 2560; ++i) mixed[i] = 0.0f;
  for (const char* bucket : {"512", "100"}) {
    for (const std::vector<float>* v : {&tiny, &mixed}) {
      ExpectSameBytes("qsgd", CodecParams({{"bucket", bucket}}), *v,
                      Context(1));
    }
  }
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

// The cross-decoding matrix: CPU and GPU payloads, each decoded by the CPU
// and the GPU; alpha 1, a power of two, and one that rounds.
const float kAlphas[] = {1.0f, 0.25f, 0.3f};

TEST_F(CudaCodecTest, DenseDecodeMatchesCpu) {
  for (const char* name : {"none", "fp16", "bf16"}) {
    for (const char* prescale : {"false", "true"}) {
      for (size_t n : kSizes) {
        for (bool on_gpu : {false, true}) {
          for (float alpha : kAlphas) {
            ExpectSameSums(name, CodecParams({{"prescale", prescale}}),
                           Normal(n, 12, 1.0f), on_gpu, alpha);
          }
        }
      }
    }
  }
}

TEST_F(CudaCodecTest, DenseDecodeOfSpecialValuesMatchesCpu) {
  // Infinities, the fp16 overflow edge, subnormals of every format, signed
  // zeros: every 16-bit exponent, without NaN (whose payload bits after
  // arithmetic are the hardware's own).
  std::vector<float> v = {0.0f,
                          -0.0f,
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          65504.0f,
                          65520.0f,
                          5.960464477539063e-8f,
                          -2.98e-8f,
                          6.1e-5f,
                          1e-40f,
                          std::numeric_limits<float>::denorm_min(),
                          std::numeric_limits<float>::max()};
  for (uint32_t bits = 0x33000000u; bits < 0x47800000u; bits += 0x10000u - 1) {
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    v.push_back(f);
    v.push_back(-f);
  }
  for (const char* name : {"none", "fp16", "bf16"}) {
    for (bool on_gpu : {false, true}) {
      for (float alpha : kAlphas) {
        ExpectSameSums(name, CodecParams(), v, on_gpu, alpha);
      }
    }
  }
}

TEST_F(CudaCodecTest, Int8DecodeMatchesCpu) {
  for (const char* stochastic : {"false", "true"}) {
    for (const char* bucket : {"1", "7", "1024", "5000"}) {
      for (size_t n : kSizes) {
        for (bool on_gpu : {false, true}) {
          for (float alpha : kAlphas) {
            ExpectSameSums(
                "int8",
                CodecParams({{"bucket", bucket}, {"stochastic", stochastic}}),
                Normal(n, 22, 0.01f), on_gpu, alpha);
          }
        }
      }
    }
  }
}

TEST_F(CudaCodecTest, Int8DecodeOfHugeAndConstantBucketsMatchesCpu) {
  // A range over FLT_MAX (decoded with unit 2), a constant bucket, a
  // subnormal range, and signed zeros.
  const float big = 3e38f;
  std::vector<float> v = {-big, big,    1.0f,   -big / 3, 2.5f,  2.5f, 2.5f,
                          2.5f, 1e-42f, 2e-42f, 0.0f,     -0.0f, 0.0f, -0.0f};
  for (bool on_gpu : {false, true}) {
    for (float alpha : kAlphas) {
      ExpectSameSums("int8", CodecParams({{"bucket", "4"}}), v, on_gpu, alpha);
    }
  }
}

TEST_F(CudaCodecTest, QsgdDecodeMatchesCpu) {
  for (const char* bits : {"2", "3", "5", "8"}) {
    for (const char* bucket : {"1", "7", "512", "3000"}) {
      for (size_t n : kSizes) {
        for (bool on_gpu : {false, true}) {
          for (float alpha : kAlphas) {
            ExpectSameSums("qsgd",
                           CodecParams({{"bits", bits}, {"bucket", bucket}}),
                           Normal(n, 32, 0.01f), on_gpu, alpha);
          }
        }
      }
    }
  }
}

TEST_F(CudaCodecTest, QsgdDecodeOfZeroBucketsMatchesCpu) {
  std::vector<float> v(4096, 0.0f);
  for (size_t i = 2048; i < v.size(); ++i) v[i] = (i % 3 == 0) ? -0.5f : 0.25f;
  for (bool on_gpu : {false, true}) {
    ExpectSameSums("qsgd", CodecParams({{"bucket", "512"}}), v, on_gpu, 0.3f);
  }
}

TEST_F(CudaCodecTest, TopKMatchesCpuOverSteps) {
  // The state (momentum u, velocity v) is carried from step to step on each
  // side; every step's payload must be the same bytes.
  const std::vector<CodecParams> configs = {
      CodecParams(),
      CodecParams({{"ratio", "0.01"}, {"sample", "0.001"}}),
      CodecParams({{"ratio", "0.1"}, {"momentum", "0"}, {"masking", "false"}}),
      CodecParams(
          {{"ratio", "0.05"}, {"nesterov", "true"}, {"clip_norm", "1.0"}}),
      CodecParams({{"ratio", "1"}}),
      CodecParams({{"warmup_steps_per_stage", "1"}}),
  };
  for (size_t c = 0; c < configs.size(); ++c) {
    for (size_t n : {size_t{1}, size_t{7}, size_t{1000}, size_t{4099},
                     size_t{100003}, (size_t{1} << 20) + 3}) {
      std::unique_ptr<SingleRoundCodec> cpu = CpuCodec("topk", configs[c]);
      std::unique_ptr<CudaCodec> gpu =
          CreateCudaCodec("topk", configs[c]).value();
      TensorState cpu_state, gpu_state;
      const std::vector<int64_t> shape = {static_cast<int64_t>(n)};
      for (int64_t step = 0; step < 5; ++step) {
        const std::vector<float> grad = Normal(n, 50 + step, 1.0f);
        StepContext ctx = Context(0);
        ctx.step = step;
        Bytes cpu_payload, gpu_payload;
        ASSERT_TRUE(
            cpu->Encode(TensorView{grad, shape}, cpu_state, ctx, &cpu_payload)
                .ok());
        const absl::Status s =
            gpu->Encode(TensorView{grad, shape}, gpu_state, ctx, &gpu_payload);
        ASSERT_TRUE(s.ok()) << s;
        EXPECT_TRUE(cpu_payload == gpu_payload)
            << "config " << c << " n=" << n << " step " << step << ": "
            << PayloadDiff(cpu_payload, gpu_payload);
      }
    }
  }
}

TEST_F(CudaCodecTest, TopKDecodeMatchesCpu) {
  for (const char* ratio : {"0.001", "0.1", "1"}) {
    for (size_t n : kSizes) {
      for (bool on_gpu : {false, true}) {
        for (float alpha : kAlphas) {
          ExpectSameSums("topk", CodecParams({{"ratio", ratio}}),
                         Normal(n, 60, 1.0f), on_gpu, alpha);
        }
      }
    }
  }
}

}  // namespace
}  // namespace gradcomp::codecs::cuda
