#include "service/collective/gather_batch_message.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradcomp::service {
namespace {

using ::testing::HasSubstr;

// One entry header: `present`, then `size` little-endian.
std::string Entry(uint8_t present, uint64_t size) {
  std::string out(1, static_cast<char>(present));
  for (int b = 0; b < 8; ++b) out.push_back(static_cast<char>(size >> (8 * b)));
  return out;
}

absl::Status Split(const std::string& message, size_t members,
                   std::vector<std::optional<codecs::Bytes>>* out) {
  out->assign(members, std::nullopt);
  return SplitGatherMessage(message, 7, out);
}

void ExpectRefused(const std::string& message, size_t members,
                   const std::string& why) {
  std::vector<std::optional<codecs::Bytes>> out;
  const absl::Status status = Split(message, members, &out);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("rank 7's batch message"));
  EXPECT_THAT(status.message(), HasSubstr(why));
}

TEST(GatherBatchMessageTest, RoundTripsPresentAbsentAndEmptyPayloads) {
  const std::vector<codecs::Bytes> payloads = {"first", "", "skipped",
                                               std::string("\0\1\2", 3), ""};
  const std::vector<bool> arrived = {true, true, false, true, false};
  const codecs::Bytes message = GatherMessage(payloads, arrived);
  EXPECT_EQ(message, Entry(1, 5) + "first" + Entry(1, 0) + Entry(0, 0) +
                         Entry(1, 3) + std::string("\0\1\2", 3) + Entry(0, 0));

  std::vector<std::optional<codecs::Bytes>> out;
  ASSERT_TRUE(Split(message, payloads.size(), &out).ok());
  ASSERT_EQ(out.size(), payloads.size());
  for (size_t i = 0; i < payloads.size(); ++i) {
    ASSERT_EQ(out[i].has_value(), arrived[i]) << i;
    if (arrived[i]) {
      EXPECT_EQ(*out[i], payloads[i]) << i;
    }
  }
}

TEST(GatherBatchMessageTest, NoMembersIsAnEmptyMessage) {
  EXPECT_EQ(GatherMessage({}, {}), "");
  std::vector<std::optional<codecs::Bytes>> out;
  EXPECT_TRUE(Split("", 0, &out).ok());
  ExpectRefused("x", 0, "1 bytes after its 0 members");
}

TEST(GatherBatchMessageTest, RefusesAMessageThatEndsEarly) {
  ExpectRefused("", 1, "ends at member 0 of 1");
  ExpectRefused(Entry(1, 0).substr(0, 8), 1, "ends at member 0 of 1");
  ExpectRefused(Entry(1, 2) + "ab", 2, "ends at member 1 of 2");
}

TEST(GatherBatchMessageTest, RefusesAPresenceOtherThanZeroOrOne) {
  ExpectRefused(Entry(2, 1) + "a", 1, "bad entry for member 0: presence 2");
  ExpectRefused(Entry(1, 0) + Entry(255, 0), 2,
                "bad entry for member 1: presence 255");
}

TEST(GatherBatchMessageTest, RefusesAnAbsentMemberWithALength) {
  ExpectRefused(Entry(0, 1) + "a", 1, "bad entry for member 0: presence 0");
}

TEST(GatherBatchMessageTest, RefusesALengthPastTheEnd) {
  ExpectRefused(Entry(1, 4) + "abc", 1, "4 bytes, 3 left");
  ExpectRefused(Entry(1, 1) + "a" + Entry(1, 10) + "b", 2,
                "bad entry for member 1");
}

TEST(GatherBatchMessageTest, ALengthNear2To64DoesNotWrapAround) {
  // at + size would wrap to a small offset inside the message.
  for (uint64_t size : {UINT64_MAX, UINT64_MAX - 8, UINT64_MAX - 20}) {
    ExpectRefused(Entry(1, size) + std::string(24, 'x') + Entry(1, 0), 2,
                  "bad entry for member 0");
  }
}

TEST(GatherBatchMessageTest, RefusesTrailingBytes) {
  ExpectRefused(Entry(1, 1) + "ab", 1, "1 bytes after its 1 members");
  ExpectRefused(Entry(0, 0) + Entry(0, 0), 1, "9 bytes after its 1 members");
}

}  // namespace
}  // namespace gradcomp::service
