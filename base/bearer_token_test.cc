#include "base/bearer_token.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradcomp {
namespace {

using ::testing::HasSubstr;

TEST(NormalizeBearerTokenTest, TrimsSurroundingAsciiWhitespace) {
  const absl::StatusOr<std::string> token =
      NormalizeBearerToken(" \t0123456789abcdef\r\n");
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, "0123456789abcdef");
}

TEST(NormalizeBearerTokenTest, WhitespaceOnlyIsNoToken) {
  const absl::StatusOr<std::string> token = NormalizeBearerToken(" \n");
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, "");
}

TEST(NormalizeBearerTokenTest, EveryPrintableByteIsKept) {
  std::string all;
  for (char c = '!'; c <= '~'; ++c) all.push_back(c);
  const absl::StatusOr<std::string> token = NormalizeBearerToken(all);
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, all);
}

TEST(NormalizeBearerTokenTest, AnInnerSpaceControlOrHighByteIsNamed) {
  for (const auto& [raw, byte] :
       {std::pair<std::string, std::string>{"abc def", "0x20"},
        {"abc\tdef", "0x09"},
        {std::string("abc\0def", 7), "0x00"},
        {"abc\x7f", "0x7f"},
        {"t\xc3\xb6ken", "0xc3"}}) {
    const absl::Status status = NormalizeBearerToken(raw).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << raw;
    EXPECT_THAT(status.message(), HasSubstr(byte)) << raw;
  }
}

}  // namespace
}  // namespace gradcomp
