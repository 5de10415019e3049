#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "absl/status/statusor.h"
#include "codecs/fuzz/decode_checker.h"
#include "gtest/gtest.h"

namespace gradcomp::codecs::fuzz {
namespace {

namespace fs = std::filesystem;

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// corpus/<codec>/<input>: every input of every codec's corpus keeps its
// codec's decoders to their contract.
TEST(CorpusTest, EveryInputKeepsTheDecodeContract) {
  const fs::path root = "codecs/fuzz/corpus";
  ASSERT_TRUE(fs::is_directory(root));
  int inputs = 0;
  for (const fs::directory_entry& dir : fs::directory_iterator(root)) {
    const std::string codec = dir.path().filename().string();
    absl::StatusOr<DecodeChecker> checker = DecodeChecker::Create(codec);
    ASSERT_TRUE(checker.ok()) << checker.status();
    for (const fs::directory_entry& file : fs::directory_iterator(dir)) {
      const absl::Status s = checker->Check(ReadFile(file.path()));
      EXPECT_TRUE(s.ok()) << file.path() << ": " << s;
      ++inputs;
    }
  }
  EXPECT_GT(inputs, 0);
}

}  // namespace
}  // namespace gradcomp::codecs::fuzz
