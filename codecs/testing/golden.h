// Golden payloads pin the wire format: fixed inputs and seeds, encoded by
// each codec, stored under tests/testdata/golden/<name>.bin and compared byte
// for byte by golden_test. A new codec adds rows to GoldenCases().
//
// To regenerate after a deliberate format change (and a version bump, see
// docs/wire-format.md):
//   bazel run //codecs/testing:make_golden -- $PWD/tests/testdata/golden
#ifndef GRADCOMP_CODECS_TESTING_GOLDEN_H_
#define GRADCOMP_CODECS_TESTING_GOLDEN_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "codecs/tensor.h"

namespace gradcomp::codecs::testing {

struct GoldenCase {
  std::string file;  // "<file>.bin" in tests/testdata/golden
  std::string codec;
  std::map<std::string, std::string> params;
  std::vector<int64_t> shape;
  int world_size = 1;
  int rank = 0;
  int64_t step = 0;
  // Steps encoded before the pinned one, for codecs whose state matters.
  int warmup_steps = 0;
};

const std::vector<GoldenCase>& GoldenCases();

// The input of a case: Philox uniforms (our own stable generator, unlike the
// standard library's distributions) spread over [-4, 4), with special values
// (zeros, a tiny, fp16's largest, a value that overflows fp16) up front.
std::vector<float> GoldenInput(const GoldenCase& c, int64_t step);

// The payload of the pinned step, from the built-in codecs.
absl::StatusOr<Bytes> MakeGoldenPayload(const GoldenCase& c);

}  // namespace gradcomp::codecs::testing

#endif  // GRADCOMP_CODECS_TESTING_GOLDEN_H_
