#include "service/transport/chunk_checksums.h"

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/string_view.h"
#include "base/crc32c.h"
#include "gtest/gtest.h"

namespace gradcomp::service {
namespace {

TEST(ChunkChecksumsTest, IsTheCrcOfTheChunksPiecesInOrder) {
  ChunkChecksums checksums;
  const std::string a = "header:", b = "the body of chunk zero";
  const absl::string_view pieces[] = {a, b};
  EXPECT_EQ(checksums.Of(0, pieces), Crc32c(a + b));
  const absl::string_view c = "chunk two comes before chunk one";
  EXPECT_EQ(checksums.Of(2, {&c, 1}), Crc32c(c));
  const absl::string_view d = "one";
  EXPECT_EQ(checksums.Of(1, {&d, 1}), Crc32c(d));
}

TEST(ChunkChecksumsTest, AChunkIsComputedOnceAndRemembered) {
  ChunkChecksums checksums;
  const absl::string_view first = "the bytes of chunk 0";
  const uint32_t crc = checksums.Of(0, {&first, 1});
  // Later callers get the remembered value; the pieces are not read again
  // (so different ones here still give the first CRC).
  const absl::string_view other = "other bytes";
  EXPECT_EQ(checksums.Of(0, {&other, 1}), crc);
  EXPECT_NE(Crc32c(other), crc);
}

TEST(ChunkChecksumsTest, ConcurrentWritersAgree) {
  ChunkChecksums checksums;
  std::vector<std::string> chunks;
  for (int i = 0; i < 64; ++i)
    chunks.push_back(std::string(4096 + i, 'a' + i % 26));
  std::vector<std::vector<uint32_t>> seen(3);
  std::vector<std::thread> writers;
  for (int w = 0; w < 3; ++w) {
    writers.emplace_back([&, w] {
      for (size_t i = 0; i < chunks.size(); ++i) {
        const absl::string_view piece = chunks[i];
        seen[w].push_back(checksums.Of(i, {&piece, 1}));
      }
    });
  }
  for (std::thread& t : writers) t.join();
  for (size_t i = 0; i < chunks.size(); ++i) {
    for (int w = 0; w < 3; ++w) EXPECT_EQ(seen[w][i], Crc32c(chunks[i])) << i;
  }
}

}  // namespace
}  // namespace gradcomp::service
