#include "service/engine/policy_schedule.h"

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradcomp::service {
namespace {

using ::testing::HasSubstr;

Policy DefaultCodec(const std::string& name) {
  Policy policy;
  policy.default_codec = {name, {}};
  return policy;
}

std::string CodecAt(const PolicySchedule& schedule, int64_t step) {
  return schedule.For(step)->policy.default_codec.name;
}

TEST(PolicyScheduleTest, AScheduledPolicyDecidesItsStepsAndLaterOnesOnly) {
  PolicySchedule schedule(DefaultCodec("none"));
  const absl::StatusOr<std::string> hash =
      schedule.Set(DefaultCodec("fp16"), 100);
  ASSERT_TRUE(hash.ok()) << hash.status();
  EXPECT_EQ(*hash, PolicyHash(DefaultCodec("fp16")));
  EXPECT_EQ(CodecAt(schedule, 0), "none");
  EXPECT_EQ(CodecAt(schedule, 99), "none");
  EXPECT_EQ(CodecAt(schedule, 100), "fp16");
  EXPECT_EQ(CodecAt(schedule, 1 << 30), "fp16");
  EXPECT_EQ(schedule.Latest()->hash, *hash);
  EXPECT_EQ(schedule.Latest()->from_step, 100);

  // A later schedule keeps what comes before it.
  schedule.Set(DefaultCodec("bf16"), 200);
  EXPECT_EQ(CodecAt(schedule, 99), "none");
  EXPECT_EQ(CodecAt(schedule, 150), "fp16");
  EXPECT_EQ(CodecAt(schedule, 200), "bf16");

  // One at an earlier step replaces those at or after it.
  schedule.Set(DefaultCodec("int8"), 150);
  EXPECT_EQ(CodecAt(schedule, 149), "fp16");
  EXPECT_EQ(CodecAt(schedule, 150), "int8");
  EXPECT_EQ(CodecAt(schedule, 250), "int8");
}

TEST(PolicyScheduleTest, APolicyWithoutAStepReplacesEveryOther) {
  PolicySchedule schedule(DefaultCodec("none"));
  schedule.Set(DefaultCodec("fp16"), 100);
  schedule.Set(DefaultCodec("bf16"), std::nullopt);
  EXPECT_EQ(CodecAt(schedule, -5), "bf16");
  EXPECT_EQ(CodecAt(schedule, 0), "bf16");
  EXPECT_EQ(CodecAt(schedule, 500), "bf16");
  EXPECT_FALSE(schedule.Latest()->from_step.has_value());
}

TEST(PolicyScheduleTest, AFullScheduleRefusesMoreAndDropsNothing) {
  PolicySchedule schedule(DefaultCodec("none"));
  const int64_t full = PolicySchedule::kMaxEntries - 1;
  for (int64_t i = 1; i <= full; ++i) {
    ASSERT_TRUE(schedule.Set(DefaultCodec("fp16"), 10 * i).ok()) << i;
  }
  const absl::StatusOr<std::string> refused =
      schedule.Set(DefaultCodec("bf16"), 10 * (full + 1));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(
      refused.status().message(),
      HasSubstr(
          "holds 64 policies by step before 640, the most it keeps (64;"));
  EXPECT_EQ(CodecAt(schedule, 0), "none") << "the first is kept";
  EXPECT_EQ(CodecAt(schedule, 1 << 20), "fp16");

  // One from an earlier step replaces those after it, and so makes room.
  ASSERT_TRUE(schedule.Set(DefaultCodec("bf16"), 15).ok());
  EXPECT_EQ(CodecAt(schedule, 12), "fp16");
  EXPECT_EQ(CodecAt(schedule, 1 << 20), "bf16");
}

// Peers compare the whole schedule: one policy alone hashes as GetPolicy
// shows it; a schedule hashes every entry's step and policy, so a rank
// that holds only the newest policy (restarted with it) is told apart from
// ranks that still run the old one for earlier steps.
TEST(PolicyScheduleTest, TheScheduleHashCoversEveryStepsPolicy) {
  PolicySchedule a(DefaultCodec("none"));
  EXPECT_EQ(a.ScheduleHash(), PolicyHash(DefaultCodec("none")));
  ASSERT_TRUE(a.Set(DefaultCodec("qsgd"), 100).ok());
  PolicySchedule restarted(DefaultCodec("qsgd"));
  EXPECT_EQ(restarted.Latest()->hash, a.Latest()->hash);
  EXPECT_NE(restarted.ScheduleHash(), a.ScheduleHash());
  PolicySchedule later(DefaultCodec("none"));
  ASSERT_TRUE(later.Set(DefaultCodec("qsgd"), 101).ok());
  EXPECT_NE(later.ScheduleHash(), a.ScheduleHash());
  PolicySchedule same(DefaultCodec("none"));
  ASSERT_TRUE(same.Set(DefaultCodec("qsgd"), 100).ok());
  EXPECT_EQ(same.ScheduleHash(), a.ScheduleHash());
  // Without a step, the policy replaces the schedule: one entry again.
  ASSERT_TRUE(same.Set(DefaultCodec("qsgd"), std::nullopt).ok());
  EXPECT_EQ(same.ScheduleHash(), restarted.ScheduleHash());
}

}  // namespace
}  // namespace gradcomp::service
