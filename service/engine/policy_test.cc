#include "service/engine/policy.h"

#include "codecs/builtin.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradcomp::service {
namespace {

using ::testing::HasSubstr;

PolicyRule Rule(std::string glob, std::string codec) {
  PolicyRule rule;
  rule.name_glob = std::move(glob);
  rule.codec = {std::move(codec), {}};
  return rule;
}

TensorFacts Matrix(absl::string_view name, int64_t step = 0) {
  return {name, 4096, 2, DType::kFloat32, step};
}

TEST(PolicyTest, DefaultsSendEverythingDenseForTheRightReason) {
  Policy policy;
  EXPECT_EQ(policy.dense_below_numel, 1024u);
  EXPECT_TRUE(policy.dense_1d);
  EXPECT_EQ(policy.warmup_steps, 0u);

  PolicyDecision small = Decide(policy, {"fc.bias", 10, 2, DType::kFloat32, 0});
  EXPECT_EQ(small.codec.name, "none");
  EXPECT_EQ(small.dense_reason, "small");

  PolicyDecision bias =
      Decide(policy, {"fc.bias", 5000, 1, DType::kFloat32, 0});
  EXPECT_EQ(bias.dense_reason, "1-d");

  PolicyDecision big = Decide(policy, Matrix("fc.weight"));
  EXPECT_EQ(big.codec.name, "none");
  EXPECT_EQ(big.dense_reason, "default");
}

TEST(PolicyTest, FirstMatchingRuleWins) {
  Policy policy;
  policy.rules.push_back(Rule("embed.*", "none"));
  policy.rules.push_back(Rule("*.weight", "fp16"));
  policy.rules.push_back(Rule("*", "bf16"));

  PolicyDecision embed = Decide(policy, Matrix("embed.weight"));
  EXPECT_EQ(embed.codec.name, "none");
  EXPECT_EQ(embed.dense_reason, "rule");

  PolicyDecision weight = Decide(policy, Matrix("fc1.weight"));
  EXPECT_EQ(weight.codec.name, "fp16");
  EXPECT_EQ(weight.dense_reason, "");

  EXPECT_EQ(Decide(policy, Matrix("other")).codec.name, "bf16");
}

TEST(PolicyTest, RuleMatchersOnSizeRankAndDType) {
  Policy policy;
  policy.dense_below_numel = 0;
  policy.dense_1d = false;
  PolicyRule sized = Rule("*", "fp16");
  sized.min_numel = 100;
  sized.max_numel = 1000;
  sized.min_ndim = 2;
  sized.max_ndim = 3;
  sized.dtype = DType::kBFloat16;
  policy.rules.push_back(sized);
  policy.default_codec = {"bf16", {}};

  auto codec_for = [&](uint64_t numel, uint32_t ndim, DType dtype) {
    return Decide(policy, {"t", numel, ndim, dtype, 0}).codec.name;
  };
  EXPECT_EQ(codec_for(500, 2, DType::kBFloat16), "fp16");
  EXPECT_EQ(codec_for(100, 3, DType::kBFloat16), "fp16");
  EXPECT_EQ(codec_for(1000, 2, DType::kBFloat16), "fp16");
  EXPECT_EQ(codec_for(99, 2, DType::kBFloat16), "bf16");
  EXPECT_EQ(codec_for(1001, 2, DType::kBFloat16), "bf16");
  EXPECT_EQ(codec_for(500, 1, DType::kBFloat16), "bf16");
  EXPECT_EQ(codec_for(500, 4, DType::kBFloat16), "bf16");
  EXPECT_EQ(codec_for(500, 2, DType::kFloat32), "bf16");
}

TEST(PolicyTest, WarmupStepsGoDenseThenTheRulesApply) {
  Policy policy;
  policy.warmup_steps = 3;
  policy.default_codec = {"fp16", {}};
  EXPECT_EQ(Decide(policy, Matrix("w", 0)).dense_reason, "warmup");
  EXPECT_EQ(Decide(policy, Matrix("w", 2)).dense_reason, "warmup");
  PolicyDecision after = Decide(policy, Matrix("w", 3));
  EXPECT_EQ(after.codec.name, "fp16");
  EXPECT_EQ(after.dense_reason, "");
  // The codec's own warm-up (DGC's stages) counts from here.
  EXPECT_EQ(after.warmup_offset, 3);
}

TEST(PolicyTest, ValidateAcceptsKnownCodecs) {
  Policy policy;
  policy.rules.push_back(Rule("*.weight", "fp16"));
  policy.default_codec = {"bf16", {}};
  EXPECT_TRUE(ValidatePolicy(policy, codecs::BuiltinCodecs()).ok());
}

TEST(PolicyTest, ValidateNamesTheRuleWithAnUnknownCodec) {
  Policy policy;
  policy.rules.push_back(Rule("*.weight", "fp16"));
  policy.rules.push_back(Rule("conv*", "zip"));
  absl::Status s = ValidatePolicy(policy, codecs::BuiltinCodecs());
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("policy rule 1 (name_glob 'conv*')"));
  EXPECT_THAT(s.message(), HasSubstr("zip"));
  EXPECT_THAT(s.message(), HasSubstr("fp16"));  // the known codecs are listed
}

TEST(PolicyTest, ValidateRejectsBadParamsAndRanges) {
  Policy params;
  params.default_codec = {"fp16", {{"bogus", "1"}}};
  absl::Status s = ValidatePolicy(params, codecs::BuiltinCodecs());
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("default_codec"));
  EXPECT_THAT(s.message(), HasSubstr("bogus"));

  Policy range;
  PolicyRule rule = Rule("*", "none");
  rule.min_numel = 10;
  rule.max_numel = 5;
  range.rules.push_back(rule);
  s = ValidatePolicy(range, codecs::BuiltinCodecs());
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("min_numel 10 is above max_numel 5"));

  Policy classes;
  classes.rules.push_back(Rule("layer[0-3].*", "fp16"));
  s = ValidatePolicy(classes, codecs::BuiltinCodecs());
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'[' starts a character class"));

  Policy empty_name;
  empty_name.rules.push_back(Rule("*", ""));
  EXPECT_EQ(ValidatePolicy(empty_name, codecs::BuiltinCodecs()).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PolicyTest, HashIsStableAndSensitive) {
  Policy policy;
  // Pinned (checked by hand: FNV-1a 64 of the little-endian serialisation):
  // peers compare hashes across processes and versions, so a change of the
  // serialisation must be deliberate.
  EXPECT_EQ(PolicyHash(policy), "935559d7e794f19e");
  const std::string base = PolicyHash(policy);

  Policy param = policy;
  param.default_codec.params["ratio"] = "0.01";
  EXPECT_NE(PolicyHash(param), base);

  Policy warm = policy;
  warm.warmup_steps = 1;
  EXPECT_NE(PolicyHash(warm), base);

  Policy rule = policy;
  rule.rules.push_back(Rule("*", "none"));
  EXPECT_NE(PolicyHash(rule), base);

  // Field boundaries are part of the serialisation: "ab"+"c" != "a"+"bc".
  Policy a = policy, b = policy;
  a.rules.push_back(Rule("ab", "c"));
  b.rules.push_back(Rule("a", "bc"));
  EXPECT_NE(PolicyHash(a), PolicyHash(b));
}

TEST(PolicyTest, AggregationComesFromTheRuleElseThePolicy) {
  Policy policy;
  policy.rules.push_back(Rule("embed.*", "topk"));
  policy.rules.back().aggregation = Aggregation::kSharded;
  policy.rules.push_back(Rule("*.weight", "qsgd"));
  policy.default_codec = {"signsgd", {}};
  EXPECT_EQ(Decide(policy, Matrix("embed.weight")).aggregation,
            Aggregation::kSharded);
  EXPECT_EQ(Decide(policy, Matrix("fc.weight")).aggregation,
            Aggregation::kAllgather);
  policy.aggregation = Aggregation::kAuto;
  EXPECT_EQ(Decide(policy, Matrix("fc.weight")).aggregation,
            Aggregation::kAuto);
  EXPECT_EQ(Decide(policy, Matrix("other")).aggregation, Aggregation::kAuto);
  EXPECT_EQ(Decide(policy, Matrix("embed.weight")).aggregation,
            Aggregation::kSharded);
}

TEST(PolicyTest, AggregationIsInTheHashOnlyWhenSet) {
  Policy policy;
  policy.rules.push_back(Rule("*", "topk"));
  const std::string base = PolicyHash(policy);
  // Unchanged from the hash of a release without the setting.
  EXPECT_EQ(PolicyHash(Policy()), "935559d7e794f19e");

  Policy sharded = policy;
  sharded.aggregation = Aggregation::kSharded;
  Policy automatic = policy;
  automatic.aggregation = Aggregation::kAuto;
  Policy rule_sharded = policy;
  rule_sharded.rules[0].aggregation = Aggregation::kSharded;
  Policy rule_allgather = policy;
  rule_allgather.rules[0].aggregation = Aggregation::kAllgather;
  const std::vector<std::string> hashes = {
      base, PolicyHash(sharded), PolicyHash(automatic),
      PolicyHash(rule_sharded), PolicyHash(rule_allgather)};
  for (size_t i = 0; i < hashes.size(); ++i) {
    for (size_t j = i + 1; j < hashes.size(); ++j) {
      EXPECT_NE(hashes[i], hashes[j]) << i << " vs " << j;
    }
  }
}

}  // namespace
}  // namespace gradcomp::service
