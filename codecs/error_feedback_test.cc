#include "codecs/error_feedback.h"

#include <cmath>
#include <random>
#include <vector>

#include "codecs/testing/random_inputs.h"
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

// A rounding codec that refuses to encode at one step, as an inner codec
// may refuse an input it cannot code.
class RefusingCodec : public RoundingCodec {
 public:
  RefusingCodec(float step, int64_t refused_step)
      : RoundingCodec(step, /*summable=*/false), refused_step_(refused_step) {}

  absl::Status Encode(const TensorView& grad, TensorState& state,
                      const StepContext& ctx, Bytes* payload) const override {
    if (ctx.step == refused_step_) {
      return absl::InvalidArgumentError("refused for the test");
    }
    return RoundingCodec::Encode(grad, state, ctx, payload);
  }

 private:
  int64_t refused_step_;
};

absl::Status EncodeAt(const ErrorFeedback& ef, const std::vector<float>& g,
                      TensorState& state, int64_t step) {
  const int64_t shape[] = {static_cast<int64_t>(g.size())};
  StepContext ctx;
  ctx.step = step;
  Bytes payload;
  return ef.Encode(TensorView{g, shape}, state, ctx, &payload);
}

// The residual's values, to compare within rounding.
std::vector<float> Residual(TensorState& state) {
  const absl::Span<float> e = *state.Find(kErrorFeedbackBuffer);
  return std::vector<float>(e.begin(), e.end());
}

// Every value finite and within `tolerance` of `before`.
void ExpectGivenBack(const std::vector<float>& after,
                     const std::vector<float>& before, float tolerance) {
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    ASSERT_TRUE(std::isfinite(after[i])) << i;
    ASSERT_NEAR(after[i], before[i], tolerance) << i;
  }
}

TEST(ErrorFeedbackTest, RefusedStepGivesTheResidualBack) {
  constexpr size_t kN = 5000;
  ErrorFeedback ef(std::make_unique<RefusingCodec>(0.25f, /*refused=*/5));
  TensorState state;
  for (int64_t step = 0; step < 5; ++step) {
    ASSERT_TRUE(
        EncodeAt(ef, testing::Normal(kN, 10 + step, 1.0f), state, step).ok());
  }
  const std::vector<float> before = Residual(state);
  // Large against the residual: (e + g) - g is e rounded to g's scale
  // (|e + g| < 64, whose ulp is 2^-18).
  EXPECT_EQ(EncodeAt(ef, testing::Normal(kN, 15, 10.0f), state, 5).code(),
            absl::StatusCode::kInvalidArgument);
  ExpectGivenBack(Residual(state), before, 1.0f / (1 << 18));
  EXPECT_TRUE(EncodeAt(ef, testing::Normal(kN, 16, 1.0f), state, 6).ok());
}

// A rounding codec that refuses NaN and Inf, as every inner codec of the
// decorator does (the rounding codec alone would code them).
class FiniteOnlyCodec : public RoundingCodec {
 public:
  explicit FiniteOnlyCodec(float step)
      : RoundingCodec(step, /*summable=*/false) {}

  absl::Status Encode(const TensorView& grad, TensorState& state,
                      const StepContext& ctx, Bytes* payload) const override {
    for (float v : grad.values) {
      if (!std::isfinite(v)) return absl::InvalidArgumentError("not finite");
    }
    return RoundingCodec::Encode(grad, state, ctx, payload);
  }
};

TEST(ErrorFeedbackTest, ANonFiniteSumRestartsItsEntryAndNoOther) {
  constexpr size_t kN = 300;
  ErrorFeedback ef(std::make_unique<FiniteOnlyCodec>(0.25f));
  TensorState state;
  ASSERT_TRUE(EncodeAt(ef, testing::Normal(kN, 20, 1.0f), state, 0).ok());
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    const std::vector<float> before = Residual(state);
    std::vector<float> g = testing::Normal(kN, 23, 10.0f);
    g[123] = bad;
    EXPECT_EQ(EncodeAt(ef, g, state, 1).code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
    std::vector<float> after = Residual(state);
    EXPECT_EQ(after[123], 0.0f) << bad;
    after[123] = before[123];
    ExpectGivenBack(after, before, 1.0f / (1 << 18));
  }
  EXPECT_TRUE(EncodeAt(ef, testing::Normal(kN, 24, 1.0f), state, 2).ok());
}

TEST(ErrorFeedbackTest, AnOverflowingSumRestartsItsEntry) {
  // Rounding to multiples of 1e38 leaves e = 0.4e38 of 1.4e38; then
  // g + e = 3.2e38 + 0.4e38 overflows although both are finite, and
  // (g + e) - g would be Inf.
  ErrorFeedback ef(std::make_unique<FiniteOnlyCodec>(1e38f));
  TensorState state;
  ASSERT_TRUE(EncodeAt(ef, {1.4e38f, 1.0f}, state, 0).ok());
  const std::vector<float> before = Residual(state);
  EXPECT_EQ(EncodeAt(ef, {3.2e38f, 1.0f}, state, 1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Residual(state), (std::vector<float>{0.0f, before[1]}));
  EXPECT_TRUE(EncodeAt(ef, {-1e38f, 1.0f}, state, 2).ok());
}

TEST(ErrorFeedbackTest, BadPayloadIsTheInnerCodecsError) {
  ErrorFeedback ef(std::make_unique<RoundingCodec>(1.0f, false));
  std::vector<float> acc(2, 0.0f);
  EXPECT_EQ(ef.DecodeAdd("garbage", 1.0f, absl::MakeSpan(acc)).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace gradcomp::codecs
