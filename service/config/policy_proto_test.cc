#include "service/config/policy_proto.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradcomp::service {
namespace {

using ::testing::HasSubstr;

TEST(PolicyProtoTest, UnsetFieldsTakeTheDefaults) {
  const absl::StatusOr<Policy> parsed = PolicyFromProto(v1::Policy());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const Policy& policy = *parsed;
  EXPECT_EQ(policy.dense_below_numel, 1024u);
  EXPECT_TRUE(policy.dense_1d);
  EXPECT_EQ(policy.warmup_steps, 0u);
  EXPECT_EQ(policy.default_codec.name, "none");
  EXPECT_TRUE(policy.rules.empty());
  EXPECT_EQ(policy.aggregation, Aggregation::kAllgather);
}

TEST(PolicyProtoTest, ExplicitZeroAndFalseAreKept) {
  v1::Policy proto;
  proto.set_dense_below_numel(0);
  proto.set_dense_1d(false);
  const absl::StatusOr<Policy> policy = PolicyFromProto(proto);
  ASSERT_TRUE(policy.ok()) << policy.status();
  EXPECT_EQ(policy->dense_below_numel, 0u);
  EXPECT_FALSE(policy->dense_1d);
}

TEST(PolicyProtoTest, RoundTripKeepsEveryField) {
  v1::Policy proto;
  v1::PolicyRule* rule = proto.add_rules();
  rule->set_name_glob("layer*.weight");
  rule->set_min_numel(10);
  rule->set_max_numel(20);
  rule->set_min_ndim(2);
  rule->set_max_ndim(4);
  rule->set_dtype(v1::DTYPE_BFLOAT16);
  rule->mutable_codec()->set_name("topk");
  (*rule->mutable_codec()->mutable_params())["ratio"] = "0.01";
  rule->set_aggregation(v1::AGGREGATION_AUTO);
  proto.set_dense_below_numel(5);
  proto.set_dense_1d(false);
  proto.set_warmup_steps(3);
  proto.mutable_default_codec()->set_name("fp16");
  proto.set_aggregation(v1::AGGREGATION_SHARDED);

  const absl::StatusOr<Policy> parsed = PolicyFromProto(proto);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const Policy& policy = *parsed;
  ASSERT_EQ(policy.rules.size(), 1u);
  EXPECT_EQ(policy.rules[0].dtype, DType::kBFloat16);
  EXPECT_EQ(policy.rules[0].codec.params.at("ratio"), "0.01");
  EXPECT_EQ(policy.rules[0].aggregation, Aggregation::kAuto);
  EXPECT_EQ(policy.aggregation, Aggregation::kSharded);
  EXPECT_EQ(PolicyToProto(policy).SerializeAsString(),
            proto.SerializeAsString());
}

TEST(PolicyProtoTest, WhatAPolicyCannotHoldIsRefused) {
  // Params without a name would have run "none" where a codec was meant.
  v1::Policy proto;
  (*proto.mutable_default_codec()->mutable_params())["ratio"] = "0.01";
  absl::StatusOr<Policy> policy = PolicyFromProto(proto);
  EXPECT_EQ(policy.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(policy.status().message(),
              HasSubstr("default_codec has params (ratio, ...) but no name"));

  // A newer client's aggregation would have run as the default.
  proto = v1::Policy();
  proto.set_aggregation(static_cast<v1::Aggregation>(7));
  policy = PolicyFromProto(proto);
  EXPECT_EQ(policy.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(policy.status().message(), HasSubstr("policy aggregation is 7"));

  proto = v1::Policy();
  proto.add_rules()->mutable_codec()->set_name("fp16");
  proto.add_rules()->set_aggregation(static_cast<v1::Aggregation>(9));
  policy = PolicyFromProto(proto);
  EXPECT_EQ(policy.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(policy.status().message(),
              HasSubstr("policy rule 1 aggregation is 9"));
}

}  // namespace
}  // namespace gradcomp::service
