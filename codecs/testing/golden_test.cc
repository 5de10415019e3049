#include "codecs/testing/golden.h"

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace gradcomp::codecs::testing {
namespace {

constexpr char kDir[] = "tests/testdata/golden/";

class GoldenTest : public ::testing::TestWithParam<GoldenCase> {};

TEST_P(GoldenTest, EncodingMatchesTheStoredPayloadByteForByte) {
  const GoldenCase& c = GetParam();
  std::ifstream in(std::string(kDir) + c.file + ".bin", std::ios::binary);
  ASSERT_TRUE(in.good()) << "missing " << kDir << c.file << ".bin";
  std::stringstream stored;
  stored << in.rdbuf();
  absl::StatusOr<Bytes> payload = MakeGoldenPayload(c);
  ASSERT_TRUE(payload.ok()) << payload.status();
  ASSERT_EQ(payload->size(), stored.str().size());
  for (size_t i = 0; i < payload->size(); ++i) {
    ASSERT_EQ((*payload)[i], stored.str()[i])
        << c.file << ": first difference at byte " << i
        << ". A deliberate format change needs a version bump "
           "(docs/wire-format.md), then: bazel run "
           "//codecs/testing:make_golden -- $PWD/tests/testdata/golden";
  }
}

INSTANTIATE_TEST_SUITE_P(Codecs, GoldenTest, ::testing::ValuesIn(GoldenCases()),
                         [](const ::testing::TestParamInfo<GoldenCase>& info) {
                           return info.param.file;
                         });

TEST(GoldenCasesTest, FileNamesAreUnique) {
  std::set<std::string> names;
  for (const GoldenCase& c : GoldenCases()) {
    EXPECT_TRUE(names.insert(c.file).second) << c.file;
  }
}

}  // namespace
}  // namespace gradcomp::codecs::testing
