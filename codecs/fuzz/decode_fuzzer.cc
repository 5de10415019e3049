// libFuzzer entry point of one codec's decoder fuzz target. The build
// (codecs/fuzz/fuzz.bzl) compiles it once per codec with GRADCOMP_FUZZ_CODEC
// set to the codec's registry name.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "codecs/fuzz/decode_checker.h"

#define GRADCOMP_FUZZ_STR_(x) #x
#define GRADCOMP_FUZZ_STR(x) GRADCOMP_FUZZ_STR_(x)

namespace {

using gradcomp::codecs::fuzz::DecodeChecker;

const DecodeChecker& Checker() {
  static const DecodeChecker* const checker = [] {
    absl::StatusOr<DecodeChecker> c =
        DecodeChecker::Create(GRADCOMP_FUZZ_STR(GRADCOMP_FUZZ_CODEC));
    if (!c.ok()) {
      std::fprintf(stderr, "decode_fuzzer: %s\n",
                   c.status().ToString().c_str());
      std::abort();
    }
    return new DecodeChecker(*std::move(c));
  }();
  return *checker;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::Status s = Checker().Check(
      absl::string_view(reinterpret_cast<const char*>(data), size));
  if (!s.ok()) {
    // libFuzzer saves the input that aborted as a crash artifact.
    std::fprintf(stderr, "decode_fuzzer: %s\n",
                 std::string(s.message()).c_str());
    std::abort();
  }
  return 0;
}
