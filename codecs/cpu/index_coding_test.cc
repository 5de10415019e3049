#include "codecs/cpu/index_coding.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradcomp::codecs {
namespace {

std::string Encode(const std::vector<uint32_t>& indices) {
  const IndexPlan plan = PlanIndices(indices);
  std::string out(plan.bytes, '\0');
  EncodeIndices(indices, plan, out.data());
  return out;
}

std::vector<uint32_t> RoundTrip(const std::vector<uint32_t>& indices,
                                uint64_t numel) {
  const std::string bytes = Encode(indices) + "tail";
  std::vector<uint32_t> out;
  const absl::StatusOr<size_t> used =
      DecodeIndices(bytes, indices.size(), numel, &out);
  EXPECT_TRUE(used.ok()) << used.status();
  EXPECT_EQ(*used, bytes.size() - 4);
  return out;
}

TEST(IndexCodingTest, RoundTripsEdgeSets) {
  const std::vector<std::vector<uint32_t>> sets = {
      {},
      {0},
      {0, 1, 2, 3},   // all gaps 0: width 0
      {4294967294u},  // a 32-bit gap
      {0, 4294967294u},
      {7, 8, 1000, 1001, 1u << 30},
  };
  for (const auto& s : sets) EXPECT_EQ(RoundTrip(s, 4294967295u), s);
}

TEST(IndexCodingTest, RoundTripsRandomSetsOfManyBlocks) {
  std::mt19937 gen(3);
  for (int density_exp = 1; density_exp <= 4; ++density_exp) {
    std::bernoulli_distribution keep(std::pow(10.0, -density_exp));
    std::vector<uint32_t> s;
    for (uint32_t i = 0; i < 2'000'000; ++i) {
      if (keep(gen)) s.push_back(i);
    }
    EXPECT_EQ(RoundTrip(s, 2'000'000), s) << density_exp;
  }
}

TEST(IndexCodingTest, UsesFewBitsAtLowDensity) {
  std::vector<uint32_t> s;
  for (uint32_t i = 0; i < 1000; ++i) s.push_back(i * 1000 + (i * 7) % 13);
  // Gaps below 2^10: about 10 bits, not 32, per index.
  EXPECT_LE(Encode(s).size(), 1000u * 10 / 8 + 8);
}

TEST(IndexCodingTest, RejectsWhatIsNotACanonicalSetBelowNumel) {
  std::vector<uint32_t> out;
  const std::string good = Encode({3, 9});  // width byte 3, then 6 bits
  EXPECT_TRUE(DecodeIndices(good, 2, 10, &out).ok());
  // 9 is not below numel 9.
  EXPECT_FALSE(DecodeIndices(good, 2, 9, &out).ok());
  // Width above 32.
  std::string wide = good;
  wide[0] = 33;
  EXPECT_FALSE(DecodeIndices(wide, 2, 10, &out).ok());
  // Padding bits set: 2 gaps of 3 bits use 6 of the 8 bits.
  std::string padded = good;
  padded[1] = static_cast<char>(padded[1] | 0x80);
  EXPECT_FALSE(DecodeIndices(padded, 2, 10, &out).ok());
  // Too short for the widths, or for the width bytes.
  EXPECT_FALSE(DecodeIndices(good.substr(0, 1), 2, 10, &out).ok());
  EXPECT_FALSE(DecodeIndices("", 1, 10, &out).ok());
  // A huge count with a few bytes fails before allocating it.
  EXPECT_FALSE(DecodeIndices(good, 1u << 30, 1u << 31, &out).ok());
}

// Indices are 32-bit: in a tensor of more elements (no encoder sends one,
// but a peer's bytes may say so) an index of 2^32 would be stored as 0.
TEST(IndexCodingTest, RejectsAnIndexPast32BitsWhateverNumel) {
  // Width 32; gaps 0 and 2^32 - 1: indices 0 and 2^32.
  const std::string bytes =
      std::string("\x20", 1) + std::string(4, '\0') + std::string(4, '\xff');
  std::vector<uint32_t> out;
  const absl::StatusOr<size_t> got =
      DecodeIndices(bytes, 2, (uint64_t{1} << 32) + 10, &out);
  ASSERT_FALSE(got.ok()) << "decoded as " << out[0] << ", " << out[1];
  EXPECT_THAT(std::string(got.status().message()),
              ::testing::HasSubstr("index 4294967296 at position 1"));
}

}  // namespace
}  // namespace gradcomp::codecs
