#include "service/engine/policy_schedule.h"

#include <cstdint>
#include <string>

#include "gtest/gtest.h"

namespace gradcomp::service {
namespace {

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
  const std::string hash = schedule.Set(DefaultCodec("fp16"), 100);
  EXPECT_EQ(hash, PolicyHash(DefaultCodec("fp16")));
  EXPECT_EQ(CodecAt(schedule, 0), "none");
  EXPECT_EQ(CodecAt(schedule, 99), "none");
  EXPECT_EQ(CodecAt(schedule, 100), "fp16");
  EXPECT_EQ(CodecAt(schedule, 1 << 30), "fp16");
  EXPECT_EQ(schedule.Latest()->hash, hash);
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

TEST(PolicyScheduleTest, OnlyTheLastEntriesAreKept) {
  PolicySchedule schedule(DefaultCodec("none"));
  for (int64_t i = 1; i <= static_cast<int64_t>(PolicySchedule::kMaxEntries);
       ++i) {
    schedule.Set(DefaultCodec(i % 2 == 0 ? "fp16" : "bf16"), 10 * i);
  }
  // The initial policy went first: step 0 falls to the oldest kept (10).
  EXPECT_EQ(CodecAt(schedule, 0), "bf16");
  EXPECT_EQ(CodecAt(schedule, 19), "bf16");
  EXPECT_EQ(CodecAt(schedule, 20), "fp16");
  EXPECT_EQ(CodecAt(schedule, 1 << 20),
            PolicySchedule::kMaxEntries % 2 == 0 ? "fp16" : "bf16");
}

}  // namespace
}  // namespace gradcomp::service
