#include "base/file_bytes.h"

#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradcomp {
namespace {

using ::testing::HasSubstr;

TEST(ReadFileBytesTest, ReadsAWholeFile) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/bytes");
  const std::string bytes("with a \0 inside\n", 16);
  std::ofstream(path, std::ios::binary) << bytes;
  const absl::StatusOr<std::string> read = ReadFileBytes(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, bytes);
}

TEST(ReadFileBytesTest, AMissingFileIsNotFoundNamingIt) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/absent");
  const absl::Status status = ReadFileBytes(path).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr(path));
}

// A directory opens as a stream and reads as "": gradcompctl policy --set
// given one sent an empty policy, and gradcompd --config ran on defaults.
TEST(ReadFileBytesTest, ADirectoryIsNoFile) {
  const absl::Status status = ReadFileBytes(::testing::TempDir()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("is a directory"));
}

}  // namespace
}  // namespace gradcomp
