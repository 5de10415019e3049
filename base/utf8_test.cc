#include "base/utf8.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace gradcomp {
namespace {

TEST(Utf8Test, WellFormedTextPasses) {
  for (const std::string text :
       {"", "10.0.0.1:50052", "caf\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x98\x80",
        "\xEF\xBF\xBF", "\xF4\x8F\xBF\xBF"}) {
    EXPECT_TRUE(IsValidUtf8(text)) << text;
  }
}

TEST(Utf8Test, MalformedTextIsFoundAtItsFirstBadByte) {
  struct Case {
    std::string text;
    size_t bad;
  };
  for (const Case& c : std::vector<Case>{
           {"10.0.0.1:500\x86"
            "52",
            12},                     // a lone continuation byte
           {"a\xC0\x83", 1},         // overlong
           {"\xE0\x80\xAF", 0},      // overlong
           {"\xED\xA0\x80", 0},      // a surrogate
           {"\xF4\x90\x80\x80", 0},  // above U+10FFFF
           {"\xF5\x80\x80\x80", 0},
           {"ab\xC3", 2},  // truncated
           {"\xE2\x82", 0},
           {"\xE2\x28\xA1", 0},  // bad continuation
       }) {
    EXPECT_EQ(FirstInvalidUtf8Byte(c.text), c.bad) << c.text;
    EXPECT_FALSE(IsValidUtf8(c.text));
  }
}

TEST(Utf8Test, SequenceBytesCountsOneWholeCharacter) {
  const std::string text = "a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80";
  EXPECT_EQ(Utf8SequenceBytes(text, 0), 1u);
  EXPECT_EQ(Utf8SequenceBytes(text, 1), 2u);
  EXPECT_EQ(Utf8SequenceBytes(text, 2), 0u);  // a continuation byte
  EXPECT_EQ(Utf8SequenceBytes(text, 3), 3u);
  EXPECT_EQ(Utf8SequenceBytes(text, 6), 4u);
  EXPECT_EQ(Utf8SequenceBytes("\xE2\x82", 0), 0u);  // truncated
  EXPECT_EQ(Utf8SequenceBytes("\xFF", 0), 0u);
}

}  // namespace
}  // namespace gradcomp
