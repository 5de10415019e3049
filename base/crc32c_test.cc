#include "base/crc32c.h"

#include <cstdint>
#include <random>
#include <string>

#include "gtest/gtest.h"

namespace gradcomp {
namespace {

using crc32c_internal::ExtendHardware;
using crc32c_internal::ExtendPortable;

using Extend = uint32_t (*)(uint32_t, const void*, size_t);

uint32_t Of(Extend extend, const std::string& s) {
  return extend(0, s.data(), s.size());
}

// The implementations under test: the table always, the instruction where
// this CPU has it.
std::vector<Extend> Implementations() {
  std::vector<Extend> out = {&ExtendPortable};
  if (Crc32cUsesHardware()) out.push_back(&ExtendHardware);
  return out;
}

// RFC 3720 (iSCSI) appendix B.4 and the usual check value.
TEST(Crc32cTest, KnownVectors) {
  std::string zeros(32, '\0'), ones(32, '\xff'), up(32, 0), down(32, 0);
  for (int i = 0; i < 32; ++i) {
    up[i] = static_cast<char>(i);
    down[i] = static_cast<char>(31 - i);
  }
  for (Extend extend : Implementations()) {
    EXPECT_EQ(Of(extend, ""), 0u);
    EXPECT_EQ(Of(extend, "123456789"), 0xe3069283u);
    EXPECT_EQ(Of(extend, zeros), 0x8a9136aau);
    EXPECT_EQ(Of(extend, ones), 0x62a8ab43u);
    EXPECT_EQ(Of(extend, up), 0x46dd794eu);
    EXPECT_EQ(Of(extend, down), 0x113fdb5cu);
  }
  EXPECT_EQ(Crc32c("123456789"), 0xe3069283u);
}

// Lengths and alignments that reach every branch of the hardware path (the
// unaligned head, three-way 8 KiB and 256-byte blocks, the 8-byte and byte
// tails) agree with the table, and extending in pieces equals one pass.
TEST(Crc32cTest, ImplementationsAgreeOnRandomData) {
  std::mt19937 rng(7);
  std::string data(3 * 8192 * 2 + 3 * 256 + 29, '\0');
  for (char& c : data) c = static_cast<char>(rng());
  const size_t sizes[] = {0,   1,   7,     8,     9,     255,
                          768, 769, 24575, 24576, 24577, data.size() - 7};
  for (size_t offset : {0, 1, 3, 7}) {
    for (size_t n : sizes) {
      const char* p = data.data() + offset;
      const uint32_t want = ExtendPortable(0, p, n);
      for (Extend extend : Implementations()) {
        EXPECT_EQ(extend(0, p, n), want) << "offset " << offset << " n " << n;
        const size_t cut = n / 3;
        EXPECT_EQ(extend(extend(0, p, cut), p + cut, n - cut), want)
            << "offset " << offset << " n " << n << " cut " << cut;
      }
      EXPECT_EQ(Crc32cExtend(0, p, n), want);
    }
  }
}

TEST(Crc32cTest, EveryChangedByteChangesTheChecksum) {
  std::string data(1000, 'a');
  const uint32_t clean = Crc32c(data);
  for (size_t i = 0; i < data.size(); i += 37) {
    std::string bad = data;
    bad[i] ^= 0x01;
    EXPECT_NE(Crc32c(bad), clean) << "byte " << i;
  }
}

}  // namespace
}  // namespace gradcomp
