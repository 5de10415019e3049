#include "codecs/error_feedback.h"

#include <cmath>
#include <random>
#include <vector>

#include "codecs/testing/rounding_codec.h"
#include "gtest/gtest.h"

namespace gradcomp::codecs {
namespace {

using ::gradcomp::codecs::testing::RoundingCodec;

TEST(ErrorFeedbackTest,
     KeepsTheInvariantGradPlusOldErrorIsDecodedPlusNewError) {
  ErrorFeedback ef(std::make_unique<RoundingCodec>(0.25f, false));
  EXPECT_TRUE(ef.info().stateful);
  EXPECT_FALSE(ef.info().unbiased);
  const std::vector<int64_t> shape = {64};
  TensorState state;
  StepContext ctx;
  std::mt19937 gen(5);
  std::normal_distribution<float> normal(0.0f, 0.3f);
  for (int step = 0; step < 20; ++step) {
    std::vector<float> g(64);
    for (float& v : g) v = normal(gen);
    const std::vector<float> e_old(
        state.Buffer(kErrorFeedbackBuffer, 64).begin(),
        state.Buffer(kErrorFeedbackBuffer, 64).end());
    Bytes payload;
    ASSERT_TRUE(ef.Encode({g, shape}, state, ctx, &payload).ok());
    std::vector<float> decoded(64, 0.0f);
    ASSERT_TRUE(ef.DecodeAdd(payload, 1.0f, absl::MakeSpan(decoded)).ok());
    absl::Span<float> e_new = *state.Find(kErrorFeedbackBuffer);
    for (int i = 0; i < 64; ++i) {
      // Exact up to the rounding of one fp32 addition and subtraction.
      EXPECT_NEAR(g[i] + e_old[i], decoded[i] + e_new[i], 1e-6f) << step;
      // The rounding codec's error is at most half a step.
      EXPECT_LE(std::fabs(e_new[i]), 0.125f + 1e-6f);
    }
  }
}

TEST(ErrorFeedbackTest, ResidualCarriesSmallGradientsUntilTheyAreSent) {
  // 0.1 per step never survives rounding to 1 on its own; with error
  // feedback the sum over 10 steps is sent in full.
  ErrorFeedback ef(std::make_unique<RoundingCodec>(1.0f, true));
  const std::vector<int64_t> shape = {1};
  const std::vector<float> g = {0.1f};
  TensorState state;
  StepContext ctx;
  float sent = 0.0f;
  for (int step = 0; step < 10; ++step) {
    Bytes payload;
    ASSERT_TRUE(ef.Encode({g, shape}, state, ctx, &payload).ok());
    std::vector<float> decoded(1, 0.0f);
    ASSERT_TRUE(ef.DecodeAdd(payload, 1.0f, absl::MakeSpan(decoded)).ok());
    sent += decoded[0];
  }
  EXPECT_NEAR(sent + (*state.Find(kErrorFeedbackBuffer))[0], 1.0f, 1e-5f);
  EXPECT_EQ(sent, 1.0f);
}

TEST(ErrorFeedbackTest, WorksThroughSessionsAndKeepsTheInnerCollective) {
  ErrorFeedback ef(std::make_unique<RoundingCodec>(1.0f, true));
  const std::vector<int64_t> shape = {2};
  const std::vector<float> g = {0.4f, 2.6f};
  TensorState state;
  StepContext ctx;
  auto session = *ef.Start({g, shape}, state, ctx);
  std::optional<Round> round = *session->NextRound();
  ASSERT_TRUE(round.has_value());
  EXPECT_EQ(round->collective, Collective::kSum);
  std::vector<float> own(2);
  ASSERT_TRUE(session->DecodeOwn(absl::MakeSpan(own)).ok());
  EXPECT_EQ(own, std::vector<float>({0.0f, 3.0f}));
  absl::Span<float> e = *state.Find(kErrorFeedbackBuffer);
  EXPECT_NEAR(e[0], 0.4f, 1e-6f);
  EXPECT_NEAR(e[1], -0.4f, 1e-6f);
}

// A rounding codec that declares an in-place FinishSum.
class InPlaceRoundingCodec : public RoundingCodec {
 public:
  InPlaceRoundingCodec() : RoundingCodec(1.0f, /*summable=*/true) {}
  bool FinishSumInPlace() const override { return true; }
};

TEST(ErrorFeedbackTest, FinishesSumsInPlaceWhenTheInnerCodecDoes) {
  EXPECT_TRUE(ErrorFeedback(std::make_unique<InPlaceRoundingCodec>())
                  .FinishSumInPlace());
  EXPECT_FALSE(ErrorFeedback(std::make_unique<RoundingCodec>(1.0f, true))
                   .FinishSumInPlace());
}

TEST(ErrorFeedbackTest, BadPayloadIsTheInnerCodecsError) {
  ErrorFeedback ef(std::make_unique<RoundingCodec>(1.0f, false));
  std::vector<float> acc(2, 0.0f);
  EXPECT_EQ(ef.DecodeAdd("garbage", 1.0f, absl::MakeSpan(acc)).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace gradcomp::codecs
