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

}  // namespace
}  // namespace gradcomp::service
