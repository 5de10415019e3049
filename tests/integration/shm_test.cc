// The real gradcompd with client shared memory, driven by the C++ client and
// its ShmRegion helper: off by default, a reduce that reads and writes the
// region (no tensor bytes over gRPC), errors, status and unregister.
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "client/cpp/client.h"
#include "client/cpp/shm_region.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/daemon_process.h"

namespace gradcomp::testing {
namespace {

using client::Client;
using client::ShmRegion;
using client::ShmSlice;
using ::testing::HasSubstr;

std::unique_ptr<DaemonProcess> StartDaemon(
    const std::vector<std::string>& args) {
  absl::StatusOr<std::string> binary = DaemonBinary();
  EXPECT_TRUE(binary.ok()) << binary.status();
  if (!binary.ok()) return nullptr;
  absl::StatusOr<std::unique_ptr<DaemonProcess>> daemon =
      DaemonProcess::Start(*binary, args);
  EXPECT_TRUE(daemon.ok()) << daemon.status();
  return daemon.ok() ? std::move(*daemon) : nullptr;
}

TEST(ShmIntegrationTest, OffUnlessTheFlagIsGiven) {
  std::unique_ptr<DaemonProcess> daemon = StartDaemon({});
  ASSERT_NE(daemon, nullptr);
  auto client = Client::Connect(daemon->target());
  ASSERT_TRUE(client.ok());
  auto region = ShmRegion::Create(4096, "shm-test");
  ASSERT_TRUE(region.ok()) << region.status();
  absl::Status status =
      (*client)->RegisterShm("grads", (*region)->key(), 0, 4096);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("--allow_client_shm"));
}

TEST(ShmIntegrationTest, ReducesThroughTheRegion) {
  std::unique_ptr<DaemonProcess> daemon = StartDaemon({"--allow_client_shm"});
  ASSERT_NE(daemon, nullptr);
  auto client = Client::Connect(daemon->target());
  ASSERT_TRUE(client.ok());
  const size_t n = 1 << 16;
  const uint64_t bytes = n * sizeof(float);
  auto region = ShmRegion::Create(2 * bytes, "shm-test");
  ASSERT_TRUE(region.ok()) << region.status();
  absl::Span<float> floats = (*region)->floats();
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  for (size_t i = 0; i < n; ++i) floats[i] = normal(rng);
  ASSERT_TRUE(
      (*client)->RegisterShm("grads", (*region)->key(), 0, 2 * bytes).ok());

  const std::vector<int64_t> shape = {256, 256};
  const ShmSlice in{"grads", 0, bytes}, out{"grads", bytes, bytes};
  auto stats = (*client)->ReduceShm("job", "fc.weight", 0, v1::DTYPE_FLOAT32,
                                    shape, in, out);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->codec(), "none");
  EXPECT_EQ(stats->raw_bytes(), bytes);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(floats[n + i], floats[i]) << i;

  // A compressing codec writes its (lossy) average into the same place.
  v1::CodecSpec qsgd;
  qsgd.set_name("qsgd");
  (*qsgd.mutable_params())["bits"] = "8";
  stats = (*client)->ReduceShm("job", "fc.weight", 1, v1::DTYPE_FLOAT32, shape,
                               in, out, qsgd);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->codec(), "qsgd");
  EXPECT_LT(stats->wire_bytes(), bytes / 3);
  double diff = 0, norm = 0;
  for (size_t i = 0; i < n; ++i) {
    diff += std::pow(double{floats[n + i]} - floats[i], 2);
    norm += std::pow(double{floats[i]}, 2);
  }
  EXPECT_LT(std::sqrt(diff / norm), 0.1);

  auto listed = (*client)->ShmStatus();
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->regions_size(), 1);
  EXPECT_EQ(listed->regions(0).byte_size(), 2 * bytes);

  // Errors keep their codes through the real daemon.
  EXPECT_EQ((*client)
                ->ReduceShm("job", "fc.weight", 2, v1::DTYPE_FLOAT32, shape,
                            {"grads", bytes + 4, bytes}, out)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*client)
                ->ReduceShm("job", "fc.weight", 2, v1::DTYPE_FLOAT32, shape,
                            {"absent", 0, bytes}, out)
                .status()
                .code(),
            absl::StatusCode::kNotFound);
  auto other = Client::Connect(daemon->target());
  ASSERT_TRUE(other.ok());
  auto second = ShmRegion::Create(64, "shm-test");
  ASSERT_TRUE(second.ok());
  absl::Status clash = (*other)->RegisterShm("grads", (*second)->key(), 0, 64);
  EXPECT_EQ(clash.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(clash.message(), HasSubstr((*client)->client_id()));

  ASSERT_TRUE((*client)->UnregisterShm("").ok());
  EXPECT_EQ((*client)->ShmStatus()->regions_size(), 0);
  // The name is free again.
  EXPECT_TRUE((*other)->RegisterShm("grads", (*second)->key(), 0, 64).ok());
}

}  // namespace
}  // namespace gradcomp::testing
