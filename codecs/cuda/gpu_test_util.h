// What the GPU codec tests share: a fixture that skips (never passes) where
// no GPU answers, byte and bit comparisons of CPU and GPU results with
// readable failures, and a decode into device memory read back to the host.
//
//   class MyGpuTest : public GpuTest {};
//   TEST_F(MyGpuTest, Same) {
//     EXPECT_TRUE(cpu == gpu) << PayloadDiff(cpu, gpu);
//   }
#ifndef GRADCOMP_CODECS_CUDA_GPU_TEST_UTIL_H_
#define GRADCOMP_CODECS_CUDA_GPU_TEST_UTIL_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "codecs/cuda/cuda_codec.h"
#include "codecs/tensor.h"
#include "gtest/gtest.h"

namespace gradcomp::codecs::cuda {

// Skips every test of a fixture derived from it where CudaDeviceAvailable()
// fails (no GPU, no driver). A fixture that overrides SetUp calls this one
// first and returns if IsSkipped().
class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override;
};

// "identical", or the sizes or the first differing byte of two payloads.
std::string PayloadDiff(const Bytes& cpu, const Bytes& gpu);

// The same float bits, element for element (NaN payloads included).
bool SameBits(const std::vector<float>& a, const std::vector<float>& b);

// acc + alpha * payload, decoded by `codec` into device memory.
absl::StatusOr<std::vector<float>> GpuDecodeAdd(const CudaCodec& codec,
                                                const Bytes& payload,
                                                float alpha,
                                                std::vector<float> acc);

}  // namespace gradcomp::codecs::cuda

#endif  // GRADCOMP_CODECS_CUDA_GPU_TEST_UTIL_H_
