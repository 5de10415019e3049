#include "client/cpp/shm_region.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <unistd.h>

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

TEST(ShmRegionTest, RejectsZeroSizeAndBadTags) {
  EXPECT_THAT(ShmRegion::Create(0).status().message(),
              HasSubstr("expected a positive size"));
  for (const char* tag : {"", "a/b", "has space", "../x/"}) {
    absl::StatusOr<std::unique_ptr<ShmRegion>> region =
        ShmRegion::Create(64, tag);
    EXPECT_EQ(region.status().code(), absl::StatusCode::kInvalidArgument)
        << tag;
  }
}

}  // namespace
}  // namespace gradcomp::client
