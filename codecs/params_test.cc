#include "codecs/params.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradcomp::codecs {
namespace {

using ::testing::HasSubstr;

TEST(CodecParamsTest, ReturnsFallbackWhenAbsent) {
  CodecParams params;
  EXPECT_EQ(*params.GetDouble("ratio", 0.5), 0.5);
  EXPECT_EQ(*params.GetInt("bucket", 512), 512);
  EXPECT_EQ(*params.GetBool("prescale", true), true);
  EXPECT_EQ(*params.GetString("mode", "x"), "x");
}

TEST(CodecParamsTest, ParsesValues) {
  CodecParams params({{"ratio", "0.01"},
                      {"bucket", "-3"},
                      {"prescale", "true"},
                      {"off", "0"},
                      {"mode", "nesterov"}});
  EXPECT_DOUBLE_EQ(*params.GetDouble("ratio", 0), 0.01);
  EXPECT_EQ(*params.GetInt("bucket", 0), -3);
  EXPECT_TRUE(*params.GetBool("prescale", false));
  EXPECT_FALSE(*params.GetBool("off", true));
  EXPECT_EQ(*params.GetString("mode", ""), "nesterov");
  EXPECT_TRUE(params.CheckAllUsed("x").ok());
}

TEST(CodecParamsTest, RejectsUnparsableValuesNamingKeyAndText) {
  CodecParams params({{"ratio", "lots"}, {"bucket", "1.5"}, {"flag", "maybe"}});
  absl::StatusOr<double> d = params.GetDouble("ratio", 0);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(d.status().message(), HasSubstr("'ratio'"));
  EXPECT_THAT(d.status().message(), HasSubstr("'lots'"));
  EXPECT_FALSE(params.GetInt("bucket", 0).ok());
  EXPECT_FALSE(params.GetBool("flag", false).ok());
}

TEST(CodecParamsTest, CheckAllUsedNamesUnknownAndAcceptedKeys) {
  CodecParams params({{"ratoi", "0.1"}, {"momentum", "0.9"}});
  ASSERT_TRUE(params.GetDouble("ratio", 0.001).ok());
  ASSERT_TRUE(params.GetDouble("momentum", 0.9).ok());
  absl::Status s = params.CheckAllUsed("topk");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("unknown parameter 'ratoi' for codec 'topk'"));
  EXPECT_THAT(s.message(), HasSubstr("accepted: momentum, ratio"));
}

}  // namespace
}  // namespace gradcomp::codecs
