#include "client/cpp/npy.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/file_bytes.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradcomp::client {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Written by numpy 1.24: np.save(f, np.array([[1, 2, 3], [4, 5, 6]], '<f4')).
const std::string kNumpyF32x2x3 =
    std::string("\x93NUMPY\x01\x00v\x00", 10) +
    "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }" +
    std::string(58, ' ') + "\n" +
    std::string(
        "\x00\x00\x80?\x00\x00\x00@\x00\x00@@\x00\x00\x80@\x00\x00\xa0@"
        "\x00\x00\xc0@",
        24);

// np.save(f, np.array(3.0, '<f8')): a scalar.
const std::string kNumpyF64Scalar =
    std::string("\x93NUMPY\x01\x00v\x00", 10) +
    "{'descr': '<f8', 'fortran_order': False, 'shape': (), }" +
    std::string(62, ' ') + "\n" + std::string("\0\0\0\0\0\0\x08@", 8);

std::string FloatBytes(const std::vector<float>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()),
                     values.size() * sizeof(float));
}

// A file with `dict` as its header (padded like NumPy does) and `data`.
std::string NpyWithHeader(const std::string& dict, const std::string& data) {
  std::string header = dict;
  while ((10 + header.size() + 1) % 64 != 0) header.push_back(' ');
  header.push_back('\n');
  std::string out("\x93NUMPY\x01\x00", 8);
  out.push_back(static_cast<char>(header.size() & 0xff));
  out.push_back(static_cast<char>(header.size() >> 8));
  return out + header + data;
}

TEST(NpyTest, ParsesNumpyFloat32Matrix) {
  absl::StatusOr<NpyArray> array = ParseNpy(kNumpyF32x2x3);
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_EQ(array->dtype, NpyDType::kFloat32);
  EXPECT_THAT(array->shape, ElementsAre(2, 3));
  EXPECT_EQ(array->data, FloatBytes({1, 2, 3, 4, 5, 6}));
}

TEST(NpyTest, ParsesNumpyScalar) {
  absl::StatusOr<NpyArray> array = ParseNpy(kNumpyF64Scalar);
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_EQ(array->dtype, NpyDType::kFloat64);
  EXPECT_TRUE(array->shape.empty());
  double value = 0;
  ASSERT_EQ(array->data.size(), sizeof(value));
  std::memcpy(&value, array->data.data(), sizeof(value));
  EXPECT_EQ(value, 3.0);
}

TEST(NpyTest, SerializesExactlyLikeNumpy) {
  NpyArray array{NpyDType::kFloat32, {2, 3}, FloatBytes({1, 2, 3, 4, 5, 6})};
  absl::StatusOr<std::string> bytes = SerializeNpy(array);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, kNumpyF32x2x3);

  NpyArray scalar{NpyDType::kFloat64, {}, std::string("\0\0\0\0\0\0\x08@", 8)};
  bytes = SerializeNpy(scalar);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, kNumpyF64Scalar);
}

TEST(NpyTest, RoundTripsEveryDTypeAndRank) {
  const std::vector<std::vector<int64_t>> shapes = {{},        {5},    {2, 3},
                                                    {2, 1, 4}, {0, 7}, {3, 0}};
  for (NpyDType dtype :
       {NpyDType::kFloat16, NpyDType::kFloat32, NpyDType::kFloat64}) {
    for (const auto& shape : shapes) {
      absl::StatusOr<int64_t> numel = NumElements(shape);
      ASSERT_TRUE(numel.ok());
      NpyArray array{dtype, shape, std::string()};
      for (int64_t i = 0; i < *numel * static_cast<int64_t>(NpyItemSize(dtype));
           ++i) {
        array.data.push_back(static_cast<char>(i * 7 + 1));
      }
      absl::StatusOr<std::string> bytes = SerializeNpy(array);
      ASSERT_TRUE(bytes.ok()) << bytes.status();
      EXPECT_EQ((bytes->size() - array.data.size()) % 64, 0u)
          << "data must start 64-byte aligned";
      absl::StatusOr<NpyArray> back = ParseNpy(*bytes);
      ASSERT_TRUE(back.ok()) << back.status();
      EXPECT_EQ(back->dtype, dtype);
      EXPECT_EQ(back->shape, shape);
      EXPECT_EQ(back->data, array.data);
    }
  }
}

TEST(NpyTest, AcceptsDoubleQuotesAndNoTrailingComma) {
  absl::StatusOr<NpyArray> array = ParseNpy(NpyWithHeader(
      "{\"shape\": (1,), \"fortran_order\": False, \"descr\": \"<f4\"}",
      FloatBytes({2.5f})));
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_THAT(array->shape, ElementsAre(1));
}

TEST(NpyTest, RejectsBadMagic) {
  std::string bytes = kNumpyF32x2x3;
  bytes[1] = 'X';
  EXPECT_THAT(ParseNpy(bytes).status().message(), HasSubstr("not an npy file"));
  EXPECT_FALSE(ParseNpy("").ok());
}

TEST(NpyTest, RejectsUnknownVersion) {
  std::string bytes = kNumpyF32x2x3;
  bytes[6] = 9;
  EXPECT_THAT(ParseNpy(bytes).status().message(),
              HasSubstr("version 9.0 is not supported"));
}

TEST(NpyTest, RejectsBigEndian) {
  absl::Status status =
      ParseNpy(NpyWithHeader(
                   "{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }",
                   FloatBytes({1})))
          .status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("big-endian"));
}

TEST(NpyTest, RejectsIntegerDType) {
  EXPECT_THAT(
      ParseNpy(NpyWithHeader(
                   "{'descr': '<i4', 'fortran_order': False, 'shape': (1,), }",
                   FloatBytes({1})))
          .status()
          .message(),
      HasSubstr("'<i4' is not supported"));
}

TEST(NpyTest, RejectsFortranOrder) {
  EXPECT_THAT(
      ParseNpy(NpyWithHeader(
                   "{'descr': '<f4', 'fortran_order': True, 'shape': (1,), }",
                   FloatBytes({1})))
          .status()
          .message(),
      HasSubstr("Fortran order"));
}

TEST(NpyTest, RejectsDataLengthMismatch) {
  const std::string dict =
      "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }";
  EXPECT_THAT(
      ParseNpy(NpyWithHeader(dict, FloatBytes({1, 2, 3}))).status().message(),
      HasSubstr("needs 4 x 4 bytes"));
  EXPECT_FALSE(ParseNpy(NpyWithHeader(dict, FloatBytes({1, 2, 3, 4, 5}))).ok());
  EXPECT_TRUE(ParseNpy(NpyWithHeader(dict, FloatBytes({1, 2, 3, 4}))).ok());
}

TEST(NpyTest, RejectsTruncatedHeader) {
  EXPECT_THAT(ParseNpy(kNumpyF32x2x3.substr(0, 40)).status().message(),
              HasSubstr("exceeds"));
}

TEST(NpyTest, RejectsMalformedDicts) {
  for (const std::string dict : {
           "{'descr': '<f4', 'shape': (1,), }",
           "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}",
           "{'descr': '<f4', 'fortran_order': Maybe, 'shape': (1,), }",
           "{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }",
           "{'descr': '<f4', 'fortran_order': False, 'shape': (1,) ",
           "['descr', '<f4']",
           "{'descr: '<f4', 'fortran_order': False, 'shape': (1,), }",
       }) {
    absl::Status status =
        ParseNpy(NpyWithHeader(dict, FloatBytes({1}))).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << dict;
    EXPECT_THAT(status.message(), HasSubstr("npy header")) << dict;
  }
}

TEST(NpyTest, RejectsOverflowingShape) {
  absl::Status status =
      ParseNpy(NpyWithHeader("{'descr': '<f4', 'fortran_order': False, "
                             "'shape': (4294967296, 4294967296), }",
                             FloatBytes({1})))
          .status();
  EXPECT_THAT(status.message(), HasSubstr("too many elements"));
}

TEST(NpyTest, SerializeRejectsWrongDataLength) {
  NpyArray array{NpyDType::kFloat16, {3}, std::string(4, '\0')};
  EXPECT_EQ(SerializeNpy(array).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(NpyTest, FilesRoundTripAndMissingFileIsNotFound) {
  const std::string path =
      absl::StrCat(::testing::TempDir(), "/npy_test_roundtrip.npy");
  NpyArray array{NpyDType::kFloat32, {2}, FloatBytes({-1.5f, 4.0f})};
  ASSERT_TRUE(WriteNpyFile(path, array).ok());
  absl::StatusOr<NpyArray> back = ReadNpyFile(path);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->data, array.data);
  std::remove(path.c_str());

  absl::Status missing = ReadNpyFile(path).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.message(), HasSubstr(path));
}

// The names in `path`'s directory that start with its own: the file and
// any temporary left beside it.
std::vector<std::string> FilesBeside(const std::string& path) {
  const std::filesystem::path file(path);
  std::vector<std::string> names;
  for (const auto& entry :
       std::filesystem::directory_iterator(file.parent_path())) {
    const std::string name = entry.path().filename().string();
    if (absl::StartsWith(name, file.filename().string())) {
      names.push_back(name);
    }
  }
  return names;
}

// A file is replaced whole, and nothing is left beside it; where it cannot
// be written, what was there stays.
TEST(FileBytesTest, ReplacesAFileWholeOrNotAtAll) {
  const std::string path =
      absl::StrCat(::testing::TempDir(), "/file_bytes_test.bin");
  ASSERT_TRUE(WriteFileBytes(path, "first").ok());
  ASSERT_TRUE(chmod(path.c_str(), 0600) == 0);
  ASSERT_TRUE(WriteFileBytes(path, "second, longer").ok());
  EXPECT_EQ(*ReadFileBytes(path), "second, longer");
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u) << "a private file stays private";
  EXPECT_EQ(FilesBeside(path), std::vector<std::string>{"file_bytes_test.bin"});
  std::remove(path.c_str());
  const std::string nowhere = absl::StrCat(path, ".missing/dir/file.bin");
  EXPECT_FALSE(WriteFileBytes(nowhere, "x").ok());
  EXPECT_EQ(WriteFileBytes("/dev/null", "in place").code(),
            absl::StatusCode::kOk);
}

// A link ("latest" naming the newest checkpoint) is written through: the
// file it names gets the bytes and the link stays (before, the rename
// replaced the link and left the file as it was). A dangling link makes
// the file it names.
TEST(FileBytesTest, ALinkIsWrittenThrough) {
  const std::string dir = ::testing::TempDir();
  const std::string real = absl::StrCat(dir, "/link_test_real.bin");
  const std::string link = absl::StrCat(dir, "/link_test_latest.bin");
  std::remove(link.c_str());
  ASSERT_TRUE(WriteFileBytes(real, "OLD").ok());
  ASSERT_EQ(symlink(real.c_str(), link.c_str()), 0);
  ASSERT_TRUE(WriteFileBytes(link, "NEW bytes").ok());
  struct stat st {};
  ASSERT_EQ(lstat(link.c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode));
  EXPECT_EQ(*ReadFileBytes(real), "NEW bytes");
  std::remove(real.c_str());
  ASSERT_TRUE(WriteFileBytes(link, "made").ok());
  EXPECT_EQ(*ReadFileBytes(real), "made");
  std::remove(real.c_str());
  std::remove(link.c_str());
}

// Threads replacing one file each write a temporary of their own: the
// file ends as one of them wrote it, and every call succeeds.
TEST(FileBytesTest, ConcurrentReplacementsLeaveOneWholeFile) {
  const std::string path =
      absl::StrCat(::testing::TempDir(), "/file_bytes_race.bin");
  const std::vector<std::string> contents = {std::string(1 << 16, 'a'),
                                             std::string(1 << 10, 'b')};
  std::vector<absl::Status> failed;
  absl::Mutex mu;
  std::vector<std::thread> threads;
  for (const std::string& bytes : contents) {
    threads.emplace_back([&, bytes] {
      for (int i = 0; i < 200; ++i) {
        absl::Status status = WriteFileBytes(path, bytes);
        if (status.ok()) continue;
        absl::MutexLock lock(&mu);
        failed.push_back(std::move(status));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_TRUE(failed.empty()) << failed.front();
  const absl::StatusOr<std::string> written = ReadFileBytes(path);
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_THAT(contents, Contains(*written));
  EXPECT_EQ(FilesBeside(path), std::vector<std::string>{"file_bytes_race.bin"});
  std::remove(path.c_str());
}

}  // namespace
}  // namespace gradcomp::client
