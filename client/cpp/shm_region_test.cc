#include "client/cpp/shm_region.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <limits>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradcomp::client {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(ShmRegionTest, CreatesAZeroedUniqueObjectHeldByAFlock) {
  auto a = ShmRegion::Create(10000, "job-1");
  auto b = ShmRegion::Create(10000, "job-1");
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_THAT((*a)->key(), StartsWith("/gradcomp.job-1."));
  EXPECT_NE((*a)->key(), (*b)->key());
  EXPECT_EQ((*a)->byte_size(), 10000u);
  EXPECT_EQ((*a)->floats().size(), 2500u);
  for (char c : (*a)->bytes()) ASSERT_EQ(c, 0);

  // Another open of the object sees what the region writes, and cannot
  // take an exclusive lock while the region lives.
  (*a)->floats()[7] = 3.5f;
  const int fd = shm_open((*a)->key().c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  float value = 0;
  ASSERT_EQ(pread(fd, &value, sizeof(value), 7 * sizeof(float)),
            static_cast<ssize_t>(sizeof(value)));
  EXPECT_EQ(value, 3.5f);
  EXPECT_NE(flock(fd, LOCK_EX | LOCK_NB), 0);

  const std::string key = (*a)->key();
  a->reset();
  // Released: the lock is gone and the name is unlinked.
  EXPECT_EQ(flock(fd, LOCK_EX | LOCK_NB), 0);
  close(fd);
  EXPECT_LT(shm_open(key.c_str(), O_RDWR, 0), 0);
}

// Pages taken at Create, not at first write: a /dev/shm without room for
// them must fail Create, not SIGBUS a later write.
TEST(ShmRegionTest, ReservesItsPagesUpFront) {
  constexpr uint64_t kSize = 1 << 20;
  auto region = ShmRegion::Create(kSize, "reserved");
  ASSERT_TRUE(region.ok()) << region.status();
  const int fd = shm_open((*region)->key().c_str(), O_RDONLY, 0);
  ASSERT_GE(fd, 0);
  struct stat st;
  ASSERT_EQ(fstat(fd, &st), 0);
  close(fd);
  EXPECT_GE(static_cast<uint64_t>(st.st_blocks) * 512, kSize);
}

// A region larger than /dev/shm may hold: tmpfs refuses to fallocate it
// at once, without taking any page, so this costs no memory.
TEST(ShmRegionTest, ARegionLargerThanDevShmIsResourceExhausted) {
  struct statvfs fs;
  ASSERT_EQ(statvfs("/dev/shm", &fs), 0);
  const uint64_t limit = uint64_t{fs.f_blocks} * fs.f_frsize;
  // 32 TiB: more than any /dev/shm here, and still mappable, so that
  // without the reservation Create would succeed.
  constexpr uint64_t kSize = uint64_t{1} << 45;
  if (limit == 0 || limit >= kSize) {
    GTEST_SKIP() << "/dev/shm has no size limit below " << kSize << " bytes";
  }
  absl::StatusOr<std::unique_ptr<ShmRegion>> region =
      ShmRegion::Create(kSize, "too-big");
  EXPECT_EQ(region.status().code(), absl::StatusCode::kResourceExhausted)
      << region.status();
  EXPECT_THAT(region.status().message(),
              HasSubstr("no room for 35184372088832 bytes in /dev/shm ("));
  EXPECT_THAT(region.status().message(), HasSubstr("'/gradcomp.too-big."));
  EXPECT_THAT(region.status().message(), HasSubstr("bytes free of"));
}

// Only the creating process unlinks: a forked child that drops its copy
// leaves the parent's region (and its registration) alone.
TEST(ShmRegionTest, AForkedChildDoesNotUnlinkTheParentsRegion) {
  auto region = ShmRegion::Create(4096, "fork");
  ASSERT_TRUE(region.ok()) << region.status();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    region->reset();
    _exit(0);
  }
  int wait_status = 0;
  ASSERT_EQ(waitpid(child, &wait_status, 0), child);
  ASSERT_TRUE(WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0);
  const int fd = shm_open((*region)->key().c_str(), O_RDWR, 0);
  EXPECT_GE(fd, 0) << "the child unlinked " << (*region)->key();
  if (fd >= 0) {
    // The parent's flock is still held, too.
    EXPECT_NE(flock(fd, LOCK_EX | LOCK_NB), 0);
    close(fd);
  }
}

TEST(ShmRegionTest, RejectsZeroOrOversizedSizesAndBadTags) {
  EXPECT_THAT(ShmRegion::Create(0).status().message(),
              HasSubstr("expected a positive size"));
  // Above the largest off_t: refused before anything is created, rather
  // than an INTERNAL "ftruncate ...: Invalid argument".
  for (uint64_t size : {uint64_t{std::numeric_limits<off_t>::max()} + 1,
                        std::numeric_limits<uint64_t>::max()}) {
    absl::Status status = ShmRegion::Create(size).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(status.message(),
                HasSubstr("expected a positive size of at most "
                          "9223372036854775807"));
  }
  for (const char* tag : {"", "a/b", "has space", "../x/"}) {
    absl::StatusOr<std::unique_ptr<ShmRegion>> region =
        ShmRegion::Create(64, tag);
    EXPECT_EQ(region.status().code(), absl::StatusCode::kInvalidArgument)
        << tag;
  }
}

// A daemon started with another --shm_prefix maps only objects so named:
// the region takes that prefix, and one gradcompd would refuse is refused.
TEST(ShmRegionTest, NamesItsObjectWithTheDaemonsPrefix) {
  absl::StatusOr<std::unique_ptr<ShmRegion>> region =
      ShmRegion::Create(64, "job", 0600, "/team-a.");
  ASSERT_TRUE(region.ok()) << region.status();
  EXPECT_THAT((*region)->key(), StartsWith("/team-a.job."));
  const int fd = shm_open((*region)->key().c_str(), O_RDWR, 0);
  EXPECT_GE(fd, 0);
  close(fd);
  for (const std::string& prefix :
       {std::string(), std::string("/"), std::string("team."),
        std::string("/a/b."), "/" + std::string(100, 'x')}) {
    absl::Status status = ShmRegion::Create(64, "job", 0600, prefix).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << prefix;
    EXPECT_THAT(status.message(), HasSubstr("gradcompd --shm_prefix"));
  }
  // The longest prefix still leaves room for the longest tag.
  const std::string longest = "/" + std::string(99, 'p');
  absl::StatusOr<std::unique_ptr<ShmRegion>> full =
      ShmRegion::Create(64, std::string(128, 't'), 0600, longest);
  ASSERT_TRUE(full.ok()) << full.status();
}

// The mode as given, whatever the umask (0666 under umask 022 would be
// 0644, which a daemon of another uid could not open read-write); the
// creator must keep read and write.
TEST(ShmRegionTest, TakesItsModeWhateverTheUmask) {
  const mode_t umask_before = umask(022);
  absl::StatusOr<std::unique_ptr<ShmRegion>> shared =
      ShmRegion::Create(64, "mode", 0666);
  umask(umask_before);
  ASSERT_TRUE(shared.ok()) << shared.status();
  struct stat st {};
  ASSERT_EQ(stat(("/dev/shm" + (*shared)->key()).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0666u);
  for (mode_t mode : {mode_t{0400}, mode_t{0200}, mode_t{04600}}) {
    absl::Status status = ShmRegion::Create(64, "mode", mode).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << mode;
    EXPECT_THAT(status.message(), HasSubstr("0600 at least")) << mode;
  }
}

}  // namespace
}  // namespace gradcomp::client
