// What the GPU PowerSGD codec does where no GPU answers (every developer and
// CI machine here): Unavailable, the state untouched, never a crash; and its
// parameters and CodecInfo are the CPU twin's with or without a GPU.
#include <memory>
#include <vector>

#include "codecs/codec.h"
#include "codecs/cpu/powersgd.h"
#include "codecs/cuda/device.h"
#include "codecs/cuda/powersgd.h"
#include "codecs/params.h"
#include "codecs/state.h"
#include "gtest/gtest.h"

namespace gradcomp::codecs::cuda {
namespace {

TEST(CudaPowerSgdFallbackTest, StartIsUnavailableWithoutAGpu) {
  if (CudaDeviceAvailable().ok()) GTEST_SKIP() << "a GPU answered";
  std::unique_ptr<CudaPowerSgdCodec> codec =
      CudaPowerSgdCodec::Create(CodecParams({{"rank", "2"}})).value();
  const std::vector<float> values(64 * 48, 1.0f);
  // A low-rank plan and a dense plan (1-D).
  const std::vector<std::vector<int64_t>> shapes = {{64, 48}, {3072}};
  for (const std::vector<int64_t>& shape : shapes) {
    TensorState state;
    state.Buffer(kPowerSgdErrorBuffer, values.size())[0] = 5.0f;
    absl::StatusOr<std::unique_ptr<CodecSession>> session =
        codec->Start(TensorView{values, shape}, state, StepContext{});
    EXPECT_EQ(session.status().code(), absl::StatusCode::kUnavailable)
        << session.status();
    EXPECT_EQ(state.buffers().size(), 1u);
    EXPECT_EQ(state.Find(kPowerSgdErrorBuffer)->at(0), 5.0f);
  }
  EXPECT_EQ(PowerSgdGpu::Create().status().code(),
            absl::StatusCode::kUnavailable);
}

TEST(CudaPowerSgdFallbackTest, ParametersAreCheckedAsOnCpu) {
  const std::vector<CodecParams> bad = {
      CodecParams({{"rank", "0"}}),
      CodecParams({{"rank", "1025"}}),
      CodecParams({{"min_compression_rate", "-1"}}),
      CodecParams({{"warm_start", "maybe"}}),
      CodecParams({{"rnak", "2"}}),
  };
  for (const CodecParams& params : bad) {
    const absl::Status cpu = PowerSgdCodec::Create(params).status();
    const absl::Status gpu = CudaPowerSgdCodec::Create(params).status();
    EXPECT_EQ(cpu.code(), absl::StatusCode::kInvalidArgument) << cpu;
    EXPECT_EQ(gpu, cpu);
  }
  std::unique_ptr<CudaPowerSgdCodec> codec =
      CudaPowerSgdCodec::Create(
          CodecParams({{"rank", "4"}, {"warm_start", "false"}}))
          .value();
  EXPECT_EQ(codec->options().rank, 4);
  EXPECT_FALSE(codec->options().warm_start);
  const CodecInfo cpu = PowerSgdInfo();
  EXPECT_EQ(codec->info().name, cpu.name);
  EXPECT_EQ(codec->info().id, cpu.id);
  EXPECT_EQ(codec->info().rounds, 2);
  EXPECT_TRUE(codec->info().summable);
  EXPECT_EQ(codec->info().params, cpu.params);
}

}  // namespace
}  // namespace gradcomp::codecs::cuda
