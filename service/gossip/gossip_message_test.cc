#include "service/gossip/gossip_message.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradcomp::service {
namespace {

using ::testing::HasSubstr;

TEST(GossipMessageTest, RoundTrips) {
  const std::vector<float> values = {1.5f, -2.0f, 3.25f};
  const GossipMessageHeader header{GossipKind::kLeft, 2, 7, 3};
  codecs::Bytes bytes;
  WriteGossipMessage(header, values, &bytes);
  EXPECT_EQ(bytes.size(), kGossipHeaderBytes + 12);
  std::vector<float> out(3);
  ASSERT_TRUE(ReadGossipMessage(bytes, header, absl::MakeSpan(out)).ok());
  EXPECT_EQ(out, values);
}

TEST(GossipMessageTest, TheHeaderReadsAloneAndOnlyIfWellFormed) {
  codecs::Bytes bytes;
  WriteGossipMessage({GossipKind::kRight, 3, 9, 2, 0xC0FFEE42}, {1.0f, 2.0f},
                     &bytes);
  absl::StatusOr<GossipMessageHeader> header = ReadGossipHeader(bytes);
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(header->kind, GossipKind::kRight);
  EXPECT_EQ(header->rank, 3u);
  EXPECT_EQ(header->power_step, 9u);
  EXPECT_EQ(header->count, 2u);
  EXPECT_EQ(header->shape_hash, 0xC0FFEE42u);
  EXPECT_THAT(ReadGossipHeader(bytes.substr(0, 31)).status().message(),
              HasSubstr("shorter than its 32-byte header"));
  codecs::Bytes foreign = bytes;
  foreign[0] = 'X';
  EXPECT_THAT(ReadGossipHeader(foreign).status().message(),
              HasSubstr("not a gossip message"));
  codecs::Bytes reserved = bytes;
  reserved[6] = 1;
  EXPECT_THAT(ReadGossipHeader(reserved).status().message(),
              HasSubstr("non-zero reserved bytes"));
}

TEST(GossipMessageTest, RefusesWhatTheOtherEndDoesNotExpect) {
  const std::vector<float> values = {1, 2, 3, 4};
  codecs::Bytes bytes;
  WriteGossipMessage({GossipKind::kRight, 1, 4, 4}, values, &bytes);
  std::vector<float> out(4, -1.0f);
  EXPECT_THAT(ReadGossipMessage(bytes, {GossipKind::kRight, 1, 3, 4},
                                absl::MakeSpan(out))
                  .message(),
              HasSubstr("neighbour is at power step 4 of this edge, this end "
                        "at 3"));
  EXPECT_THAT(ReadGossipMessage(bytes, {GossipKind::kLeft, 1, 4, 4},
                                absl::MakeSpan(out))
                  .message(),
              HasSubstr("expected X input (rows x r) of rank 1"));
  EXPECT_THAT(ReadGossipMessage(bytes, {GossipKind::kRight, 2, 4, 4},
                                absl::MakeSpan(out))
                  .message(),
              HasSubstr("of rank 1, expected"));
  EXPECT_THAT(ReadGossipMessage(bytes, {GossipKind::kRight, 1, 4, 4, 7},
                                absl::MakeSpan(out))
                  .message(),
              HasSubstr("neighbour's tensor has another shape (shape hash "
                        "0x00000000, this end's 0x00000007)"));
  // A plain message where a low-rank one was due (a 1-D tensor against a
  // matrix) is named as that, though the step counts differ too.
  codecs::Bytes plain;
  WriteGossipMessage({GossipKind::kPlain, 0, 0, 4}, values, &plain);
  EXPECT_THAT(ReadGossipMessage(plain, {GossipKind::kRight, 1, 4, 4},
                                absl::MakeSpan(out))
                  .message(),
              HasSubstr("a tensor of the same shape (a matrix, or 1-D)"));
  std::vector<float> five(5);
  EXPECT_THAT(ReadGossipMessage(bytes, {GossipKind::kRight, 1, 4, 5},
                                absl::MakeSpan(five))
                  .message(),
              HasSubstr("says 4 values; expected 5 values"));
  EXPECT_THAT(
      ReadGossipMessage(bytes.substr(0, bytes.size() - 1),
                        {GossipKind::kRight, 1, 4, 4}, absl::MakeSpan(out))
          .message(),
      HasSubstr("expected 4 values"));
  EXPECT_THAT(
      ReadGossipMessage(bytes.substr(0, 10), {GossipKind::kRight, 1, 4, 4},
                        absl::MakeSpan(out))
          .message(),
      HasSubstr("shorter than its 32-byte header"));
  codecs::Bytes bad = bytes;
  bad[0] = 'X';
  EXPECT_THAT(
      ReadGossipMessage(bad, {GossipKind::kRight, 1, 4, 4}, absl::MakeSpan(out))
          .message(),
      HasSubstr("not a gossip message"));
  bad = bytes;
  bad[7] = 1;
  EXPECT_THAT(
      ReadGossipMessage(bad, {GossipKind::kRight, 1, 4, 4}, absl::MakeSpan(out))
          .message(),
      HasSubstr("reserved"));
  // Refused messages leave the output untouched.
  EXPECT_EQ(out, std::vector<float>(4, -1.0f));
}

TEST(GossipMessageTest, TheShapeHashTellsShapesOfOneSizeApart) {
  const uint32_t h = GossipShapeHash({6, 5});
  EXPECT_EQ(h, GossipShapeHash({6, 5}));
  for (const std::vector<int64_t>& other :
       std::vector<std::vector<int64_t>>{{5, 6}, {6, 4}, {30}, {6, 5, 1}, {}}) {
    EXPECT_NE(GossipShapeHash(other), h) << other.size() << " dims";
  }
}

TEST(GossipMessageTest, SparseRoundTripsAndRefusesBadIndices) {
  const std::vector<uint32_t> indices = {2, 5, 9};
  const std::vector<float> values = {1.5f, -2.0f, 3.25f};
  const GossipMessageHeader header{GossipKind::kSparse, 0, 4, 3};
  codecs::Bytes bytes;
  WriteSparseGossipMessage(header, indices, values, &bytes);
  EXPECT_EQ(bytes.size(), kGossipHeaderBytes + 24);
  std::vector<uint32_t> got_indices(3);
  std::vector<float> got_values(3);
  ASSERT_TRUE(ReadSparseGossipMessage(bytes, header, 10,
                                      absl::MakeSpan(got_indices),
                                      absl::MakeSpan(got_values))
                  .ok());
  EXPECT_EQ(got_indices, indices);
  EXPECT_EQ(got_values, values);

  std::vector<uint32_t> untouched(3, 77);
  EXPECT_THAT(
      ReadSparseGossipMessage(bytes, header, 9, absl::MakeSpan(untouched),
                              absl::MakeSpan(got_values))
          .message(),
      HasSubstr("entry 2 has index 9, expected indices strictly "
                "increasing and below the tensor's 9 elements"));
  EXPECT_EQ(untouched, std::vector<uint32_t>(3, 77));
  WriteSparseGossipMessage(header, {2, 2, 9}, values, &bytes);
  EXPECT_THAT(
      ReadSparseGossipMessage(bytes, header, 10, absl::MakeSpan(got_indices),
                              absl::MakeSpan(got_values))
          .message(),
      HasSubstr("entry 1 has index 2"));
  EXPECT_THAT(ReadSparseGossipMessage(bytes, {GossipKind::kSparse, 0, 5, 3}, 10,
                                      absl::MakeSpan(got_indices),
                                      absl::MakeSpan(got_values))
                  .message(),
              HasSubstr("neighbour is at power step 4"));
  bytes.resize(bytes.size() - 4);
  EXPECT_THAT(
      ReadSparseGossipMessage(bytes, header, 10, absl::MakeSpan(got_indices),
                              absl::MakeSpan(got_values))
          .message(),
      HasSubstr("expected 3 values (56 bytes)"));
}

}  // namespace
}  // namespace gradcomp::service
