// The GPU twins of signsgd, signum, efsign, terngrad and randomk against
// their CPU codecs: the same payload bytes for the same input, seed, rank,
// step and state, the same state after several steps, and the same sums,
// bit for bit, whichever side encoded and whichever decodes. Needs a GPU;
// skips (never passes) without one.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/types/span.h"
#include "codecs/builtin.h"
#include "codecs/codec.h"
#include "codecs/cuda/cuda_codec.h"
#include "codecs/cuda/gpu_test_util.h"
#include "codecs/params.h"
#include "codecs/state.h"
#include "codecs/testing/random_inputs.h"
#include "gtest/gtest.h"

namespace gradcomp::codecs::cuda {
namespace {

using testing::Normal;

// The same bits, or both NaN: arithmetic on a NaN keeps the operand's
// payload on x86 and gives the canonical NaN on a GPU (docs/gpu.md).
bool SameBitsOrNaN(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    uint32_t x, y;
    std::memcpy(&x, &a[i], 4);
    std::memcpy(&y, &b[i], 4);
    if (x != y && !(std::isnan(a[i]) && std::isnan(b[i]))) return false;
  }
  return true;
}

// Every state buffer of both sides, with the same names and values.
bool SameState(const TensorState& a, const TensorState& b) {
  if (a.buffers().size() != b.buffers().size()) return false;
  for (const auto& [name, values] : a.buffers()) {
    auto it = b.buffers().find(name);
    if (it == b.buffers().end() || !SameBitsOrNaN(values, it->second)) {
      return false;
    }
  }
  return true;
}

std::unique_ptr<SingleRoundCodec> CpuCodec(const std::string& name,
                                           const CodecParams& params) {
  std::unique_ptr<Codec> codec = BuiltinCodecs().Create(name, params).value();
  return std::unique_ptr<SingleRoundCodec>(
      dynamic_cast<SingleRoundCodec*>(codec.release()));
}

std::string Label(const CodecParams& params) {
  return "{" + absl::StrJoin(params.values(), ", ", absl::PairFormatter("=")) +
         "}";
}

struct Config {
  std::string name;
  CodecParams params;
};

std::vector<Config> Configs() {
  return {
      {"signsgd", CodecParams()},
      {"signum", CodecParams()},
      {"signum", CodecParams({{"momentum", "0.5"}})},
      {"efsign", CodecParams()},
      {"efsign", CodecParams({{"bucket", "64"}})},
      {"efsign", CodecParams({{"bucket", "1024"}})},
      {"onebit", CodecParams()},
      {"terngrad", CodecParams()},
      {"terngrad", CodecParams({{"bucket", "1"}})},
      {"terngrad", CodecParams({{"bucket", "7"}, {"clip_sigma", "0"}})},
      {"terngrad", CodecParams({{"bucket", "1048576"}, {"clip_sigma", "1"}})},
      {"randomk", CodecParams()},
      {"randomk", CodecParams({{"ratio", "0.5"}})},
      {"randomk", CodecParams({{"ratio", "1"}})},
      {"randomk", CodecParams({{"ratio", "0.3"}, {"scale", "false"}})},
      {"randomk", CodecParams({{"ratio", "0.1"}, {"error_feedback", "true"}})},
  };
}

const size_t kSizes[] = {
    0, 1, 7, 8, 9, 63, 64, 65, 1000, 4099, (size_t{1} << 20) + 3};

StepContext Context(int rank, int64_t step) {
  StepContext ctx;
  ctx.seed = 1234;
  ctx.tensor_id = 77;
  ctx.step = step;
  ctx.rank = rank;
  ctx.world_size = 4;
  return ctx;
}

class SinglePassGpuTest : public GpuTest {
 protected:
  // Encodes `steps` on both backends, each with its own state carried from
  // step to step; expects the same status, bytes and state at every step.
  void ExpectSameSteps(const Config& c,
                       const std::vector<std::vector<float>>& steps, int rank) {
    std::unique_ptr<SingleRoundCodec> cpu = CpuCodec(c.name, c.params);
    absl::StatusOr<std::unique_ptr<CudaCodec>> gpu =
        CreateCudaCodec(c.name, c.params);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    TensorState cpu_state, gpu_state;
    for (size_t s = 0; s < steps.size(); ++s) {
      const std::vector<int64_t> shape = {
          static_cast<int64_t>(steps[s].size())};
      const TensorView view{steps[s], shape};
      const StepContext ctx = Context(rank, 5 + static_cast<int64_t>(s));
      Bytes cpu_payload, gpu_payload;
      const absl::Status on_cpu =
          cpu->Encode(view, cpu_state, ctx, &cpu_payload);
      const absl::Status on_gpu =
          (*gpu)->Encode(view, gpu_state, ctx, &gpu_payload);
      const std::string what =
          absl::StrFormat("%s %s n=%d rank %d step %d", c.name, Label(c.params),
                          steps[s].size(), rank, s);
      ASSERT_EQ(on_cpu.code(), on_gpu.code())
          << what << ": CPU " << on_cpu << ", GPU " << on_gpu;
      if (on_cpu.ok()) {
        EXPECT_TRUE(cpu_payload == gpu_payload)
            << what << ": " << PayloadDiff(cpu_payload, gpu_payload);
      }
      EXPECT_TRUE(SameState(cpu_state, gpu_state)) << what << ": states differ";
    }
  }

  // The payload of `values` from one side, decoded on both into the same
  // nonzero accumulator with `alpha`: the same bits.
  void ExpectSameSums(const Config& c, const std::vector<float>& values,
                      bool encode_on_gpu, float alpha) {
    const std::vector<int64_t> shape = {static_cast<int64_t>(values.size())};
    const TensorView view{values, shape};
    std::unique_ptr<SingleRoundCodec> cpu = CpuCodec(c.name, c.params);
    std::unique_ptr<CudaCodec> gpu = CreateCudaCodec(c.name, c.params).value();
    TensorState state;
    Bytes payload;
    const absl::Status encoded =
        encode_on_gpu ? gpu->Encode(view, state, Context(1, 3), &payload)
                      : cpu->Encode(view, state, Context(1, 3), &payload);
    ASSERT_TRUE(encoded.ok()) << encoded;
    const std::vector<float> acc = Normal(values.size(), 99, 0.5f);
    std::vector<float> cpu_sum = acc;
    ASSERT_TRUE(cpu->DecodeAdd(payload, alpha, absl::MakeSpan(cpu_sum)).ok());
    absl::StatusOr<std::vector<float>> gpu_sum =
        GpuDecodeAdd(*gpu, payload, alpha, acc);
    ASSERT_TRUE(gpu_sum.ok()) << gpu_sum.status();
    EXPECT_TRUE(SameBits(cpu_sum, *gpu_sum))
        << c.name << " " << Label(c.params) << " n=" << values.size()
        << " alpha=" << alpha << (encode_on_gpu ? " (GPU" : " (CPU")
        << " payload)";
  }
};

TEST_F(SinglePassGpuTest, PayloadsAndStateMatchCpuOverSteps) {
  for (const Config& c : Configs()) {
    for (size_t n : kSizes) {
      for (int rank : {0, 3}) {
        std::vector<std::vector<float>> steps;
        for (uint32_t s = 0; s < 3; ++s) {
          steps.push_back(Normal(n, 100 * s + n % 97 + rank, 0.01f));
        }
        ExpectSameSteps(c, steps, rank);
      }
    }
  }
}

TEST_F(SinglePassGpuTest, SpecialValuesMatchCpu) {
  // Signed zeros, a tensor of zeros, subnormals, the fp32 extremes (whose
  // lane sums overflow to Inf: refused on both sides).
  const float denorm = std::numeric_limits<float>::denorm_min();
  const float big = std::numeric_limits<float>::max();
  const std::vector<std::vector<float>> inputs = {
      {0.0f, -0.0f, 0.0f, -0.0f, 1.0f, -1.0f, -0.0f, 0.0f, 0.5f},
      std::vector<float>(300, 0.0f),
      std::vector<float>(300, -0.0f),
      {denorm, -denorm, 1e-40f, -1e-38f, 3.0f, -2.0f, 0.0f},
      {big, -big, big, 1.0f},
      std::vector<float>(70, big),
  };
  for (const Config& c : Configs()) {
    for (const std::vector<float>& v : inputs) {
      ExpectSameSteps(c, {v, v}, 1);
    }
  }
}

TEST_F(SinglePassGpuTest, TinyValuesWhoseSquaresUnderflowMatchCpu) {
  // Normal floats near 1e-25: terngrad's clip comes from a double sum of
  // squares on the CPU (kTinySumOfSquares), and from the host's on the GPU.
  const std::vector<float> tiny = Normal(1024, 12, 1e-25f);
  for (const Config& c : Configs()) ExpectSameSteps(c, {tiny, tiny}, 1);
}

TEST_F(SinglePassGpuTest, ValuesWhoseSquaresOverflowMatchCpu) {
  // Finite values whose squares overflow an fp32 lane of SumOfSquares
  // (terngrad's clip falls back to a double sum), and whose sums with the
  // error-feedback residual or whose random-k scaling overflow (refused on
  // both sides, the state left as it was).
  std::vector<float> v = Normal(1024, 9, 1.0f);
  v[10] = 2e19f;
  v[500] = -3e38f;
  const std::vector<std::vector<float>> steps = {v, v, Normal(1024, 10, 1.0f)};
  for (const Config& c : Configs()) ExpectSameSteps(c, steps, 1);
}

TEST_F(SinglePassGpuTest, NaNAndInfAreRefusedAsOnCpu) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(),
                    std::numeric_limits<float>::infinity()}) {
    std::vector<float> v = Normal(3000, 5, 1.0f);
    v[1500] = bad;
    // A good step, the bad one (refused; signum's momentum restarts, the
    // residual is given back), a good one.
    const std::vector<std::vector<float>> steps = {Normal(3000, 6, 1.0f), v,
                                                   Normal(3000, 7, 1.0f)};
    // Random-k refuses a NaN only where its draw takes it; it is left out
    // here.
    for (const Config& c : Configs()) {
      if (c.name != "randomk") ExpectSameSteps(c, steps, 2);
    }
  }
}

TEST_F(SinglePassGpuTest, ScalesOnARoundingBoundaryMatchCpu) {
  // l1 / n exactly halfway between two floats: the GPU's parallel sum cannot
  // tell the CPU's rounding, so the host computes the CPU's sum (the path
  // such ties take); likewise a clip of exactly 1 + 2^-24.
  std::vector<float> two = {1.0f, 1.0f + 0x1p-23f};
  std::vector<float> block(64, 1.0f);
  block[17] = 1.0f + 0x1p-18f;
  std::vector<float> buckets(256, 1.0f);
  buckets[70] = 1.0f + 0x1p-18f;
  for (const char* name : {"signsgd", "signum", "efsign"}) {
    for (const std::vector<float>& v : {two, block, buckets}) {
      ExpectSameSteps({name, CodecParams()}, {v}, 0);
    }
  }
  ExpectSameSteps({"efsign", CodecParams({{"bucket", "64"}})}, {buckets}, 0);
  const std::vector<float> ones(256, 1.0f);
  ExpectSameSteps(
      {"terngrad", CodecParams({{"clip_sigma", "1.000000059604644775390625"}})},
      {ones}, 0);
}

TEST_F(SinglePassGpuTest, OneBitColumnsMatchCpu) {
  // Both ways of summing columns: narrow (lanes repeated to 64 wide, chunks
  // of 2^16) and wide (64 columns or more), with the residual carried.
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {1, 1},     {5, 3},      {1000, 1},          {700, 7},    {3, 64},
      {100, 100}, {256, 1000}, {4099, 3},          {2, 4099},   {9000, 63},
      {1, 65537}, {65, 130},   {(1 << 20) + 3, 1}, {1024, 1025}};
  std::unique_ptr<SingleRoundCodec> cpu = CpuCodec("onebit", CodecParams());
  std::unique_ptr<CudaCodec> gpu =
      CreateCudaCodec("onebit", CodecParams()).value();
  for (const auto& [rows, cols] : shapes) {
    const size_t n = static_cast<size_t>(rows * cols);
    const std::vector<int64_t> shape = {rows, cols};
    TensorState cpu_state, gpu_state;
    for (uint32_t s = 0; s < 3; ++s) {
      const std::vector<float> v = Normal(n, 7 + s, 0.01f);
      const TensorView view{v, shape};
      Bytes cpu_payload, gpu_payload;
      ASSERT_TRUE(
          cpu->Encode(view, cpu_state, Context(0, s), &cpu_payload).ok());
      const absl::Status on_gpu =
          gpu->Encode(view, gpu_state, Context(0, s), &gpu_payload);
      ASSERT_TRUE(on_gpu.ok()) << on_gpu;
      EXPECT_TRUE(cpu_payload == gpu_payload)
          << "[" << rows << ", " << cols << "] step " << s << ": "
          << PayloadDiff(cpu_payload, gpu_payload);
      EXPECT_TRUE(SameState(cpu_state, gpu_state))
          << "[" << rows << ", " << cols << "] step " << s;
    }
  }
  // A shape whose first dimension does not divide the elements.
  const std::vector<float> v(10, 1.0f);
  const std::vector<int64_t> bad = {3, 3};
  TensorState state;
  Bytes payload;
  EXPECT_EQ(
      gpu->Encode(TensorView{v, bad}, state, Context(0, 0), &payload).code(),
      absl::StatusCode::kInvalidArgument);
}

TEST_F(SinglePassGpuTest, OneBitMeansOnARoundingBoundaryMatchCpu) {
  // Column means exactly halfway between two floats (1 + 2^-24, and its
  // negative): the GPU's parallel sums cannot tell the CPU's rounding, so
  // the CPU's own chains decide: the CPU codec on the host for fewer than
  // 64 columns, the exact column kernel for 64 or more.
  std::vector<float> column(64, 1.0f);
  column[5] = 1.0f + 0x1p-18f;
  std::vector<float> negative = column;
  for (float& v : negative) v = -v;
  std::vector<float> mixed(3 * 64, 0.5f);
  for (size_t r = 0; r < 64; ++r) mixed[3 * r + 1] = negative[r];
  std::vector<float> wide(70 * 64, 0.5f);
  for (size_t r = 0; r < 64; ++r) {
    wide[70 * r + 1] = negative[r];
    wide[70 * r + 69] = column[r];
  }
  std::unique_ptr<SingleRoundCodec> cpu = CpuCodec("onebit", CodecParams());
  std::unique_ptr<CudaCodec> gpu =
      CreateCudaCodec("onebit", CodecParams()).value();
  const std::vector<std::pair<std::vector<float>, int64_t>> cases = {
      {{1.0f, 1.0f + 0x1p-23f}, 2},
      {column, 64},
      {negative, 64},
      {mixed, 64},
      {wide, 64}};
  for (const auto& [v, rows] : cases) {
    const std::vector<int64_t> shape = {rows,
                                        static_cast<int64_t>(v.size()) / rows};
    const TensorView view{v, shape};
    TensorState cpu_state, gpu_state;
    Bytes cpu_payload, gpu_payload;
    ASSERT_TRUE(cpu->Encode(view, cpu_state, Context(0, 0), &cpu_payload).ok());
    const absl::Status on_gpu =
        gpu->Encode(view, gpu_state, Context(0, 0), &gpu_payload);
    ASSERT_TRUE(on_gpu.ok()) << on_gpu;
    EXPECT_TRUE(cpu_payload == gpu_payload)
        << "[" << shape[0] << ", " << shape[1]
        << "]: " << PayloadDiff(cpu_payload, gpu_payload);
  }
}

TEST_F(SinglePassGpuTest, CrossDecodingMatchesBitForBit) {
  for (const Config& c : Configs()) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{65}, size_t{4099},
                     (size_t{1} << 20) + 3}) {
      const std::vector<float> values = Normal(n, 41, 0.01f);
      for (bool encode_on_gpu : {false, true}) {
        for (float alpha : {1.0f, 0.25f, 0.3f}) {
          ExpectSameSums(c, values, encode_on_gpu, alpha);
        }
      }
    }
  }
}

}  // namespace
}  // namespace gradcomp::codecs::cuda
