#include "service/memory/mapped_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <future>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "client/cpp/shm_region.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradcomp::service {
namespace {

using ::gradcomp::client::ShmRegion;
using ::testing::HasSubstr;

std::unique_ptr<ShmRegion> NewRegion(uint64_t size) {
  absl::StatusOr<std::unique_ptr<ShmRegion>> region =
      ShmRegion::Create(size, "mapped-region-test");
  EXPECT_TRUE(region.ok()) << region.status();
  return region.ok() ? std::move(*region) : nullptr;
}

TEST(MappedRegionTest, MapsAnUnalignedRangeBothWays) {
  std::unique_ptr<ShmRegion> client = NewRegion(3 * 4096);
  ASSERT_NE(client, nullptr);
  auto mapped = MappedRegion::Map(client->key(), 4100, 5000);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  ASSERT_EQ((*mapped)->bytes().size(), 5000u);
  client->bytes()[4100] = 'a';
  client->bytes()[9099] = 'z';
  EXPECT_EQ((*mapped)->bytes()[0], 'a');
  EXPECT_EQ((*mapped)->bytes()[4999], 'z');
  (*mapped)->bytes()[1] = 'b';
  EXPECT_EQ(client->bytes()[4101], 'b');
  EXPECT_EQ((*mapped)->key(), client->key());
}

TEST(MappedRegionTest, RangesPastTheEndOrOverflowingAreRefused) {
  std::unique_ptr<ShmRegion> client = NewRegion(4096);
  ASSERT_NE(client, nullptr);
  const uint64_t max = std::numeric_limits<uint64_t>::max();
  struct Case {
    uint64_t offset, byte_size;
  };
  for (const Case& c : {Case{0, 4097}, Case{4096, 1}, Case{4097, 0},
                        Case{8, max - 4}, Case{max, 2}, Case{1, max}}) {
    auto mapped = MappedRegion::Map(client->key(), c.offset, c.byte_size);
    EXPECT_EQ(mapped.status().code(), absl::StatusCode::kInvalidArgument)
        << c.offset << " " << c.byte_size;
  }
  EXPECT_THAT(MappedRegion::Map(client->key(), 8, max - 4).status().message(),
              HasSubstr("holds 4096 bytes"));
  EXPECT_THAT(MappedRegion::Map(client->key(), 0, 0).status().message(),
              HasSubstr("byte_size of shared memory"));
  EXPECT_TRUE(MappedRegion::Map(client->key(), 4095, 1).ok());
}

TEST(MappedRegionTest, UnknownAndMalformedKeys) {
  auto absent = MappedRegion::Map("/gradcomp.no-such-region.0", 0, 8);
  EXPECT_EQ(absent.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(absent.status().message(), HasSubstr("/dev/shm"));
  for (const std::string& key : std::vector<std::string>{
           "", "/", "noslash", "/a/b", "/..", "/" + std::string(300, 'x')}) {
    EXPECT_EQ(ValidateShmKey(key).code(), absl::StatusCode::kInvalidArgument)
        << key;
    EXPECT_EQ(MappedRegion::Map(key, 0, 8).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  EXPECT_TRUE(ValidateShmKey("/gradcomp.job.1.ab").ok());
}

TEST(MappedRegionTest, OutOfDescriptorsIsAShortageNotABadRequest) {
  std::unique_ptr<ShmRegion> client = NewRegion(4096);
  ASSERT_NE(client, nullptr);
  rlimit saved;
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  rlimit low = saved;
  low.rlim_cur = 64;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  std::vector<int> taken;
  for (int fd; (fd = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0;) {
    taken.push_back(fd);
  }
  const absl::Status status = MappedRegion::Map(client->key(), 0, 8).status();
  for (int fd : taken) close(fd);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_THAT(status.message(), HasSubstr("Too many open files"));
}

TEST(MappedRegionTest, UnlinkNameRemovesOnlyTheObjectMapped) {
  std::unique_ptr<ShmRegion> client = NewRegion(4096);
  ASSERT_NE(client, nullptr);
  const std::string key = client->key();
  auto mapped = MappedRegion::Map(key, 0, 4096);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  EXPECT_EQ((*mapped)->UnlinkName().value_or(false), true);
  EXPECT_LT(shm_open(key.c_str(), O_RDONLY, 0), 0);
  // The mapping outlives the name.
  (*mapped)->bytes()[7] = 'x';
  EXPECT_EQ(client->bytes()[7], 'x');
  EXPECT_EQ((*mapped)->UnlinkName().value_or(true), false);

  // The name given to another object since is left alone.
  const int other = shm_open(key.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(other, 0);
  EXPECT_EQ((*mapped)->UnlinkName().value_or(true), false);
  const int again = shm_open(key.c_str(), O_RDONLY, 0);
  EXPECT_GE(again, 0);
  if (again >= 0) close(again);
  close(other);
  shm_unlink(key.c_str());
}

// A client may put anything under a name it registered: a FIFO there
// must not block the reclaimer's check of the name (an open for reading
// waits for a writer), and is refused when registered.
TEST(MappedRegionTest, AFifoUnderTheNameNeitherBlocksNorMaps) {
  std::unique_ptr<ShmRegion> client = NewRegion(4096);
  ASSERT_NE(client, nullptr);
  const std::string key = client->key();
  auto mapped = MappedRegion::Map(key, 0, 4096);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  ASSERT_EQ(shm_unlink(key.c_str()), 0);
  const std::string fifo = "/dev/shm" + key;
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);

  std::packaged_task<absl::StatusOr<bool>()> check(
      [&] { return (*mapped)->UnlinkName(); });
  std::future<absl::StatusOr<bool>> unlinked = check.get_future();
  std::thread thread(std::move(check));
  const bool returned =
      unlinked.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  if (!returned) {
    // Release the blocked open so that the test ends.
    const int writer = open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (writer >= 0) close(writer);
  }
  thread.join();
  EXPECT_TRUE(returned) << "UnlinkName blocked on a FIFO";
  EXPECT_EQ(unlinked.get().value_or(true), false);  // not the object mapped

  auto fifo_mapped = MappedRegion::Map(key, 0, 4096);
  EXPECT_EQ(fifo_mapped.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(fifo_mapped.status().message(),
              HasSubstr("is not a shared-memory object"));
  unlink(fifo.c_str());
}

TEST(MappedRegionTest, CreatorAliveFollowsTheCreatorsLock) {
  std::unique_ptr<ShmRegion> client = NewRegion(4096);
  ASSERT_NE(client, nullptr);
  auto mapped = MappedRegion::Map(client->key(), 0, 4096);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  EXPECT_EQ((*mapped)->CreatorAlive().value(), true);
  // Asking twice must not leave a lock behind that hides the creator.
  EXPECT_EQ((*mapped)->CreatorAlive().value(), true);
  client.reset();
  EXPECT_EQ((*mapped)->CreatorAlive().value(), false);
  // The daemon's mapping outlives the released region.
  (*mapped)->bytes()[10] = 'x';
  EXPECT_EQ((*mapped)->bytes()[10], 'x');
}

TEST(MappedRegionTest, ATruncatedObjectIsNoLongerBacked) {
  std::unique_ptr<ShmRegion> client = NewRegion(8192);
  ASSERT_NE(client, nullptr);
  auto mapped = MappedRegion::Map(client->key(), 4096, 4096);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  EXPECT_TRUE((*mapped)->CheckStillBacked().ok());
  const int fd = shm_open(client->key().c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 4096), 0);
  close(fd);
  absl::Status status = (*mapped)->CheckStillBacked();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("truncated to 4096 bytes"));
}

// Shrunk after the check, while in use: the access reads zeros instead of
// ending the process, and the region stays refused even once the object
// has grown back (its mapping now holds zero pages, not the object).
TEST(MappedRegionTest, TruncatedInUseReadsZerosAndStaysRefused) {
  std::unique_ptr<ShmRegion> client = NewRegion(8192);
  ASSERT_NE(client, nullptr);
  std::memset(client->bytes().data(), 0x5a, 8192);
  auto mapped = MappedRegion::Map(client->key(), 0, 8192);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  const int fd = shm_open(client->key().c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 0), 0);
  const volatile char* bytes = (*mapped)->bytes().data();
  EXPECT_EQ(bytes[5000], 0);
  ASSERT_EQ(ftruncate(fd, 8192), 0);
  close(fd);
  absl::Status status = (*mapped)->CheckStillBacked();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(),
              HasSubstr("was truncated while the daemon was using it"));
}

}  // namespace
}  // namespace gradcomp::service
