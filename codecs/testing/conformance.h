// The conformance suite every codec must pass, on every backend: round-trip
// error within the codec's declared bound, payload validation (corrupted,
// truncated and padded payloads are InvalidArgument and leave the
// accumulator untouched), zero and tiny tensors, determinism, a W-worker
// simulation of the collective, and DecodeOwn consistency.
//
// A codec's test instantiates it with rows of (codec name, parameters, bound):
//
//   INSTANTIATE_TEST_SUITE_P(
//       Topk, CodecConformanceTest,
//       ::testing::Values(ConformanceCase{"topk", {{"ratio", "0.01"}}, 1.0}),
//       ConformanceCaseName);
//
// SimulateStep is the in-memory collective the suite uses; tests of other
// properties may use it too.
#ifndef GRADCOMP_CODECS_TESTING_CONFORMANCE_H_
#define GRADCOMP_CODECS_TESTING_CONFORMANCE_H_

#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "codecs/codec.h"
#include "codecs/registry.h"
#include "gtest/gtest.h"

namespace gradcomp::codecs::testing {

// The max_rel_error of a row whose error on standard-normal input says
// nothing about the codec (its comment says why): the bound is not checked.
inline constexpr double kNoErrorBound = std::numeric_limits<double>::infinity();

struct ConformanceCase {
  // The codec's registry name and parameters.
  std::string codec;
  std::map<std::string, std::string> params;
  // Upper bound on ||D(C(g)) - g|| / ||g|| for one worker's first step on a
  // standard-normal g of shape [17, 241].
  double max_rel_error = 0.0;
  // Makes the test name unique when a codec has several rows ("" = none).
  std::string label;
  // Where to create the codec; nullptr means BuiltinCodecs().
  const CodecRegistry* registry = nullptr;
};

// "fp16_prescale" from {codec "fp16", label "prescale"}.
std::string ConformanceCaseName(
    const ::testing::TestParamInfo<ConformanceCase>& info);

// One step of W workers, run in lockstep through every round with an
// in-memory collective: kSum rounds add the dense bodies in fp32 (the sum a
// real allreduce hands back), kGather rounds hand every worker all payloads.
struct SimulatedStep {
  std::vector<std::vector<float>> out;       // [rank]: Finish()
  std::vector<std::vector<float>> own;       // [rank]: DecodeOwn()
  std::vector<std::vector<Bytes>> payloads;  // [round][rank]
  std::vector<Collective> collectives;       // [round]
};

// grads[r] is rank r's gradient; states[r] its state. ctx.rank and
// ctx.world_size are set per worker from grads.size(). With `fail_round`,
// that round's collective fails instead: every worker's session ends once
// it has handed out the round's payload, and the step is an Aborted error.
absl::StatusOr<SimulatedStep> SimulateStep(
    const Codec& codec, const std::vector<std::vector<float>>& grads,
    absl::Span<const int64_t> shape, std::vector<TensorState>& states,
    StepContext ctx, std::optional<int> fail_round = std::nullopt);

// The sum a kSum collective returns: element-wise fp32 sum of the dense
// bodies, which must all have the same length.
absl::StatusOr<std::vector<float>> SumDenseBodies(
    const std::vector<Bytes>& payloads);

class CodecConformanceTest : public ::testing::TestWithParam<ConformanceCase> {
 protected:
  void SetUp() override;

  // The codec under test, and the same one seen as single-round (nullptr if
  // it has several rounds).
  std::unique_ptr<Codec> codec_;
  const SingleRoundCodec* single_ = nullptr;
};

}  // namespace gradcomp::codecs::testing

#endif  // GRADCOMP_CODECS_TESTING_CONFORMANCE_H_
