// The real gradcompd with client shared memory, driven by the C++ client and
// its ShmRegion helper: off by default, a reduce that reads and writes the
// region (no tensor bytes over gRPC), a bucket in one request with parts,
// errors, status and unregister, and an object truncated mid-request.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "client/cpp/client.h"
#include "client/cpp/shm_region.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster.h"
#include "tests/integration/daemon_process.h"

namespace gradcomp::testing {
namespace {

using client::ShmPart;
using client::ShmRegion;
using client::ShmSlice;
using ::testing::HasSubstr;
using ::testing::Not;

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
  auto client = daemon->Connect();
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
  auto client = daemon->Connect();
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
  auto other = daemon->Connect();
  ASSERT_TRUE(other.ok());
  auto second = ShmRegion::Create(64, "shm-test");
  ASSERT_TRUE(second.ok());
  absl::Status clash = (*other)->RegisterShm("grads", (*second)->key(), 0, 64);
  EXPECT_EQ(clash.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(clash.message(),
              HasSubstr("already registered by another client"));
  // Not the owner's id: a caller could send it and use the region.
  EXPECT_THAT(clash.message(), Not(HasSubstr((*client)->client_id())));

  ASSERT_TRUE((*client)->UnregisterShm("").ok());
  EXPECT_EQ((*client)->ShmStatus()->regions_size(), 0);
  // The name is free again.
  EXPECT_TRUE((*other)->RegisterShm("grads", (*second)->key(), 0, 64).ok());
}

// A bucket of three tensors as one request with parts: each part's average
// lands at its offset in the output slice, a part that reaches past the
// registered region fails alone beside the others, and a request the
// daemon refuses whole is the call's status.
TEST(ShmIntegrationTest, ReducesABucketAsOneRequestWithParts) {
  std::unique_ptr<DaemonProcess> daemon = StartDaemon({"--allow_client_shm"});
  ASSERT_NE(daemon, nullptr);
  auto client = daemon->Connect();
  ASSERT_TRUE(client.ok());
  // A 16 x 32 weight, a 32-vector bias and a 64-vector back to back: 2432
  // bytes of inputs at the region's start, outputs from byte 4096.
  const uint64_t region_bytes = 8192, bucket_bytes = 2432;
  auto region = ShmRegion::Create(region_bytes, "shm-test");
  ASSERT_TRUE(region.ok()) << region.status();
  absl::Span<float> floats = (*region)->floats();
  for (size_t i = 0; i < bucket_bytes / sizeof(float); ++i) {
    floats[i] = 0.25f * i;
  }
  ASSERT_TRUE(
      (*client)->RegisterShm("bucket", (*region)->key(), 0, region_bytes).ok());
  const std::vector<ShmPart> parts = {
      {"fc.weight", {16, 32}, 0}, {"fc.bias", {32}, 2048}, {"x", {64}, 2176}};
  const ShmSlice in{"bucket", 0, bucket_bytes};

  auto results = (*client)->ReduceShmBucket("job", 0, v1::DTYPE_FLOAT32, parts,
                                            in, {"bucket", 4096, bucket_bytes});
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_EQ(results->size(), 3u);
  for (size_t p = 0; p < parts.size(); ++p) {
    ASSERT_TRUE((*results)[p].ok()) << p << ": " << (*results)[p].status();
    EXPECT_EQ((*results)[p]->codec(), "none");
  }
  EXPECT_EQ((*results)[0]->raw_bytes(), 2048u);
  EXPECT_EQ((*results)[1]->raw_bytes(), 128u);
  EXPECT_EQ((*results)[2]->raw_bytes(), 256u);
  for (size_t i = 0; i < bucket_bytes / sizeof(float); ++i) {
    ASSERT_EQ(floats[4096 / sizeof(float) + i], floats[i]) << i;
  }

  // Outputs from byte 6000: the 64-vector's [8176, 8432) reaches past the
  // region's 8192 bytes and fails alone; the other two are reduced.
  results = (*client)->ReduceShmBucket("job", 1, v1::DTYPE_FLOAT32, parts, in,
                                       {"bucket", 6000, bucket_bytes});
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_EQ(results->size(), 3u);
  EXPECT_TRUE((*results)[0].ok()) << (*results)[0].status();
  EXPECT_TRUE((*results)[1].ok()) << (*results)[1].status();
  ASSERT_FALSE((*results)[2].ok());
  EXPECT_THAT((*results)[2].status().message(), HasSubstr("ReduceStream"));
  EXPECT_THAT((*results)[2].status().message(), HasSubstr("ends past its"));

  // Overlapping parts: the whole request is refused, naming them.
  std::vector<ShmPart> overlapping = parts;
  overlapping[1].offset = 2044;
  absl::Status refused =
      (*client)
          ->ReduceShmBucket("job", 2, v1::DTYPE_FLOAT32, overlapping, in,
                            {"bucket", 4096, bucket_bytes})
          .status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("overlap"));
}

// A client that truncates its object while its request is in flight (here
// after the daemon checked the object, while rank 0 waits for rank 1) costs
// that request and that region, not the daemon: writing the average would
// otherwise end rank 0 with SIGBUS, and every client of it with it.
TEST(ShmIntegrationTest, TruncatedMidRequestFailsThatRequestAndRegionOnly) {
  Cluster cluster(2, absl::Seconds(30), {"--allow_client_shm"});
  ASSERT_TRUE(cluster.StartAll().ok());
  auto owner = cluster.daemon(0).Connect();
  auto peer = cluster.daemon(1).Connect();
  ASSERT_TRUE(owner.ok() && peer.ok());
  const size_t n = 1 << 16;
  const uint64_t bytes = n * sizeof(float);
  const std::vector<int64_t> shape = {static_cast<int64_t>(n)};
  auto region = ShmRegion::Create(2 * bytes, "shm-test");
  ASSERT_TRUE(region.ok()) << region.status();
  for (float& value : (*region)->floats()) value = 1.0f;
  ASSERT_TRUE(
      (*owner)->RegisterShm("grads", (*region)->key(), 0, 2 * bytes).ok());
  const ShmSlice in{"grads", 0, bytes}, out{"grads", bytes, bytes};

  absl::StatusOr<v1::ReduceStats> cut = absl::UnknownError("not run");
  std::thread request([&] {
    cut = (*owner)->ReduceShm("job", "w", 0, v1::DTYPE_FLOAT32, shape, in, out);
  });
  // Held, and read: rank 0 waits for rank 1's message, so its payload is
  // made. (A region in flight alone may not have been read yet; truncated
  // then, it would read as zeros and rank 1 get 1.0.)
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  bool held = false;
  while (!held && absl::Now() < deadline) {
    auto listed = (*owner)->ShmStatus("grads");
    auto page = HttpGet(cluster.daemon(0).metrics_port(), "/metrics");
    held = listed.ok() && listed->regions_size() == 1 &&
           listed->regions(0).in_flight() > 0 && page.ok() &&
           Sample(*page, "gradcomp_peer_waiting{peer=\"1\"}") == 1;
    if (!held) absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_TRUE(held) << "rank 0 never waited for rank 1 with the region held";
  const int fd = shm_open((*region)->key().c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 0), 0);

  const std::vector<float> twos(n, 2.0f);
  auto other = (*peer)->Reduce("job", "w", 0, twos, shape);
  request.join();
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(other->values[n / 2], 1.5f);
  EXPECT_EQ(cut.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(cut.status().message(),
              HasSubstr("was truncated while the daemon was using it"));
  // Counted as what its client got: a failed reduce, not an OK one.
  const auto reduces = [&](const std::string& code) {
    auto page = HttpGet(cluster.daemon(0).metrics_port(), "/metrics");
    EXPECT_TRUE(page.ok()) << page.status();
    return page.ok() ? Sample(*page, "gradcomp_reduce_total{code=\"" + code +
                                         "\",codec=\"none\"}")
                     : -2;
  };
  EXPECT_EQ(reduces("FAILED_PRECONDITION"), 1);
  EXPECT_EQ(reduces("OK"), -1) << "absent: no reduce succeeded on rank 0";

  // Rank 0 still serves: the region grown back stays refused (its mapping
  // holds zero pages now), a new one works.
  ASSERT_EQ(ftruncate(fd, 2 * bytes), 0);
  close(fd);
  EXPECT_EQ((*owner)
                ->ReduceShm("job", "w", 1, v1::DTYPE_FLOAT32, shape, in, out)
                .status()
                .code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE((*owner)->UnregisterShm("grads").ok());
  auto fresh = ShmRegion::Create(2 * bytes, "shm-test");
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  for (float& value : (*fresh)->floats()) value = 1.0f;
  ASSERT_TRUE(
      (*owner)->RegisterShm("grads", (*fresh)->key(), 0, 2 * bytes).ok());
  std::thread again([&] {
    cut = (*owner)->ReduceShm("job", "w", 1, v1::DTYPE_FLOAT32, shape, in, out);
  });
  other = (*peer)->Reduce("job", "w", 1, twos, shape);
  again.join();
  ASSERT_TRUE(cut.ok()) << cut.status();
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ((*fresh)->floats()[n + 7], 1.5f);
}

}  // namespace
}  // namespace gradcomp::testing
