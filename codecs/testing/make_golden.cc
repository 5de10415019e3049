// Writes tests/testdata/golden/<case>.bin for every golden case:
//   bazel run //codecs/testing:make_golden -- $PWD/tests/testdata/golden
#include <cstdio>
#include <fstream>
#include <string>

#include "codecs/testing/golden.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUTPUT_DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  for (const auto& c : gradcomp::codecs::testing::GoldenCases()) {
    absl::StatusOr<gradcomp::codecs::Bytes> payload =
        gradcomp::codecs::testing::MakeGoldenPayload(c);
    if (!payload.ok()) {
      std::fprintf(stderr, "%s: %s\n", c.file.c_str(),
                   std::string(payload.status().message()).c_str());
      return 1;
    }
    const std::string path = dir + "/" + c.file + ".bin";
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(payload->data(), static_cast<std::streamsize>(payload->size()));
    if (!out) {
      std::fprintf(stderr, "%s: write failed\n", path.c_str());
      return 1;
    }
    std::printf("%s (%zu bytes)\n", path.c_str(), payload->size());
  }
  return 0;
}
