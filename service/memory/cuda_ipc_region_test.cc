// CUDA IPC regions where tools/test runs (no GPU): malformed requests are
// refused before any GPU is asked for, a well-formed one gets "this gradcompd
// has no usable CUDA device", counted once, and system shared memory works
// beside it. On a GPU machine the same binary checks that a handle no
// process exported is refused. Opening a real handle from another process:
// cuda_ipc_gpu_test (tag gpu).
#include "service/memory/cuda_ipc_region.h"

#include <cstdint>
#include <limits>
#include <memory>
#include <string>

#include "client/cpp/shm_region.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/memory/shared_memory_registry.h"
#include "service/metrics/metrics.h"
#include "service/metrics/metrics_testing.h"

namespace gradcomp::service {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

const std::string kZeroHandle(kCudaIpcHandleBytes, '\0');

TEST(CudaIpcRegionTest, MalformedRequestsAreRefusedSayingWhatWasExpected) {
  for (size_t size : {size_t{0}, size_t{63}, size_t{65}, size_t{128}}) {
    const absl::StatusOr<std::unique_ptr<CudaIpcRegion>> region =
        CudaIpcRegion::Open(std::string(size, 'h'), 0, 4096);
    EXPECT_EQ(region.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(region.status().message(),
                HasSubstr("expected the 64 bytes of a cudaIpcMemHandle_t"));
  }
  absl::Status negative = CudaIpcRegion::Open(kZeroHandle, -1, 4096).status();
  EXPECT_EQ(negative.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(negative.message(), HasSubstr("device_id -1 is negative"));
  absl::Status empty = CudaIpcRegion::Open(kZeroHandle, 0, 0).status();
  EXPECT_EQ(empty.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(empty.message(), HasSubstr("byte_size is 0"));
}

TEST(CudaIpcRegionTest, AWellFormedHandleNeedsAUsableGpu) {
  const absl::Status available = CudaIpcRegion::DeviceAvailable();
  const absl::Status opened =
      CudaIpcRegion::Open(kZeroHandle, 0, 4096).status();
  if (available.ok()) {
    // A GPU answers: an all-zero handle was exported by no process.
    EXPECT_EQ(opened.code(), absl::StatusCode::kInvalidArgument) << opened;
    EXPECT_THAT(opened.message(), HasSubstr("cudaIpcOpenMemHandle"));
    const absl::Status device =
        CudaIpcRegion::Open(kZeroHandle, 1 << 20, 4096).status();
    EXPECT_EQ(device.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(device.message(), HasSubstr("does not exist"));
  } else {
    EXPECT_EQ(available.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(available.message(),
                HasSubstr("this gradcompd has no usable CUDA device: "));
    EXPECT_EQ(opened, available);
  }
}

class CudaRegistryTest : public ::testing::Test {
 protected:
  static SharedMemoryOptions NoBackgroundReclaim() {
    SharedMemoryOptions options;
    options.reclaim_interval = absl::ZeroDuration();
    return options;
  }
  double Metric(absl::string_view name) {
    return MetricValue(*metrics_.collectable(), name);
  }

  Metrics metrics_{nullptr, "test"};
  SharedMemoryRegistry registry_{NoBackgroundReclaim(), &metrics_};
};

TEST_F(CudaRegistryTest, WithoutAGpuTheRefusalIsCountedOnceAndShmStillWorks) {
  if (CudaIpcRegion::DeviceAvailable().ok()) {
    GTEST_SKIP() << "a GPU answers here: cuda_ipc_gpu_test covers this case";
  }
  for (int attempt = 0; attempt < 3; ++attempt) {
    const absl::Status status =
        registry_.RegisterCuda("c1", "dev", kZeroHandle, 0, 4096, "");
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(status.message(),
                HasSubstr("this gradcompd has no usable CUDA device: "));
  }
  EXPECT_EQ(Metric("gradcomp_gpu_unavailable_total"), 1);
  EXPECT_TRUE(registry_.Status("c1", "").value().empty());
  EXPECT_EQ(registry_.Acquire("c1", "dev", 0, 4).status().code(),
            absl::StatusCode::kNotFound);

  absl::StatusOr<std::unique_ptr<client::ShmRegion>> shm =
      client::ShmRegion::Create(4096, "cuda-ipc-test");
  ASSERT_TRUE(shm.ok()) << shm.status();
  ASSERT_TRUE(
      registry_.RegisterSystem("c1", "grads", (*shm)->key(), 0, 4096).ok());
  absl::StatusOr<SharedMemorySlice> slice =
      registry_.Acquire("c1", "grads", 8, 16);
  ASSERT_TRUE(slice.ok()) << slice.status();
  EXPECT_FALSE(slice->on_device());
  EXPECT_EQ(slice->bytes().size(), 16u);
  EXPECT_EQ(slice->CopyToHost(absl::Span<char>()).code(),
            absl::StatusCode::kInternal);
  EXPECT_EQ(registry_.Status("c1", "grads").value()[0].kind, "system");
}

TEST_F(CudaRegistryTest, RequestChecksComeBeforeTheGpuQuestion) {
  absl::StatusOr<std::unique_ptr<client::ShmRegion>> shm =
      client::ShmRegion::Create(64, "cuda-ipc-test");
  ASSERT_TRUE(shm.ok()) << shm.status();
  ASSERT_TRUE(
      registry_.RegisterSystem("c1", "grads", (*shm)->key(), 0, 64).ok());
  const absl::Status clash =
      registry_.RegisterCuda("c2", "grads", kZeroHandle, 0, 64, "");
  EXPECT_EQ(clash.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(clash.message(), HasSubstr("another client;"));
  EXPECT_THAT(clash.message(), Not(HasSubstr("c1")));
  EXPECT_EQ(registry_.RegisterCuda("c1", "", kZeroHandle, 0, 64, "").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry_.RegisterCuda("c1", "dev", "short", 0, 64, "").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry_.RegisterCuda("c1", "dev", kZeroHandle, 0, 0, "").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry_.RegisterCuda("c1", "dev", kZeroHandle, -3, 64, "").code(),
            absl::StatusCode::kInvalidArgument);
  // None of these is the missing GPU: nothing was counted.
  EXPECT_EQ(Metric("gradcomp_gpu_unavailable_total"), 0);
}

}  // namespace
}  // namespace gradcomp::service
