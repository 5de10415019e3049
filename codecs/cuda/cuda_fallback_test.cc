// What the GPU codecs do where no GPU answers (every developer and CI machine
// here): say so with Unavailable, never crash, and check parameters exactly
// as the CPU codecs do.
#include <memory>
#include <vector>

#include "codecs/codec.h"
#include "codecs/cuda/cuda_codec.h"
#include "codecs/cuda/device.h"
#include "codecs/params.h"
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
}

TEST(CudaFallbackTest, CodecsWithoutAGpuEncoderAreNotFound) {
  const absl::Status s = CreateCudaCodec("topk", CodecParams()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.message().find("qsgd"), absl::string_view::npos) << s.message();
}

}  // namespace
}  // namespace gradcomp::codecs::cuda
