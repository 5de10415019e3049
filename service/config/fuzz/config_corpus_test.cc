// Replays the seed corpus of config_fuzzer under the normal build, so that
// every seed (and every crash input added to the corpus) stays a test.
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "gtest/gtest.h"
#include "service/config/fuzz/config_checker.h"

namespace gradcomp::service {
namespace {

absl::Status CheckText(char format, const std::string& text) {
  const std::string bytes = std::string(1, format) + text;
  return CheckConfigBytes(reinterpret_cast<const uint8_t*>(bytes.data()),
                          bytes.size());
}

TEST(ConfigCorpusTest, EverySeedParsesValidatesAndRoundTrips) {
  const std::filesystem::path dir = "service/config/fuzz/corpus/config";
  int seeds = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    std::ifstream in(entry.path(), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)),
                            std::istreambuf_iterator<char>());
    // Seeds named invalid_* are meant to be refused, the others accepted.
    const absl::Status status = CheckConfigBytes(
        reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    const bool invalid =
        entry.path().filename().string().rfind("invalid_", 0) == 0;
    EXPECT_EQ(status.ok(), !invalid) << entry.path() << ": " << status;
    ++seeds;
  }
  EXPECT_GE(seeds, 5);
}

TEST(ConfigCorpusTest, TheFirstByteChoosesTheFormat) {
  EXPECT_TRUE(CheckText(0, R"({"world_size": 1})").ok());
  EXPECT_TRUE(CheckText(1, "world_size: 1").ok());
  EXPECT_EQ(CheckText(0, "world_size: 1").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckText(1, R"({"world_size": 1})").code(),
            absl::StatusCode::kInvalidArgument);
  // Sniffed: '{' is JSON, anything else text format.
  EXPECT_TRUE(CheckText(2, R"( {"world_size": 1})").ok());
  EXPECT_TRUE(CheckText(2, "rank: 0").ok());
}

}  // namespace
}  // namespace gradcomp::service
