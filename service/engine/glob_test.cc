#include "service/engine/glob.h"

#include "gtest/gtest.h"

namespace gradcomp::service {
namespace {

TEST(GlobTest, EmptyPatternAndStarMatchEverything) {
  EXPECT_TRUE(GlobMatch("", "fc1.weight"));
  EXPECT_TRUE(GlobMatch("*", "fc1.weight"));
  EXPECT_TRUE(GlobMatch("*", ""));
}

TEST(GlobTest, LiteralMustMatchWholeName) {
  EXPECT_TRUE(GlobMatch("fc1.weight", "fc1.weight"));
  EXPECT_FALSE(GlobMatch("fc1.weight", "fc1.weight2"));
  EXPECT_FALSE(GlobMatch("fc1.weight", "xfc1.weight"));
  EXPECT_FALSE(GlobMatch("fc1", ""));
}

TEST(GlobTest, StarSpansDotsAndBacktracks) {
  EXPECT_TRUE(GlobMatch("*.weight", "layer1.conv.weight"));
  EXPECT_FALSE(GlobMatch("*.weight", "layer1.conv.bias"));
  EXPECT_TRUE(GlobMatch("layer*.conv*.weight", "layer1.conv2.weight"));
  EXPECT_TRUE(GlobMatch("*ab", "aab"));
  EXPECT_TRUE(GlobMatch("a*b*c", "abbbc"));
  EXPECT_FALSE(GlobMatch("a*b*c", "abbbd"));
  EXPECT_TRUE(GlobMatch("a**", "a"));
}

// A `*` in the tensor's name is a character like any other: the pattern's
// `*` meeting it was taken for a literal, with no backtrack, so "*" missed
// "*x" (a review helper, through a real daemon's policy).
TEST(GlobTest, AStarInTheNameIsMatchedLikeAnyCharacter) {
  EXPECT_TRUE(GlobMatch("*", "*x"));
  EXPECT_TRUE(GlobMatch("a*b", "a*xb"));
  EXPECT_TRUE(GlobMatch("*.weight", "*a.weight"));
  EXPECT_TRUE(GlobMatch("a*", "a*"));
  EXPECT_FALSE(GlobMatch("a*b", "a*x"));
}

TEST(GlobTest, QuestionMarkIsExactlyOneCharacter) {
  EXPECT_TRUE(GlobMatch("fc?.bias", "fc1.bias"));
  EXPECT_FALSE(GlobMatch("fc?.bias", "fc.bias"));
  EXPECT_FALSE(GlobMatch("fc?.bias", "fc12.bias"));
  // A character, not a byte: e-acute is 2 bytes, the CJK one 3.
  EXPECT_TRUE(GlobMatch("?.w", "\xC3\xA9.w"));
  EXPECT_FALSE(GlobMatch("??.w", "\xC3\xA9.w"));
  EXPECT_TRUE(GlobMatch("a?b",
                        "a\xE6\x97\xA5"
                        "b"));
  EXPECT_TRUE(GlobMatch("*?.w", "x\xC3\xA9.w"));
  EXPECT_FALSE(GlobMatch("*???.w", "x\xC3\xA9.w"));
}

}  // namespace
}  // namespace gradcomp::service
