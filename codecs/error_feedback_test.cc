#include "codecs/error_feedback.h"

#include <cmath>
#include <random>
#include <string>
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

std::vector<float> Normal(size_t n, float sd, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, sd);
  std::vector<float> x(n);
  for (float& v : x) v = normal(gen);
  return x;
}

absl::Status EncodeAt(const ErrorFeedback& ef, const std::vector<float>& g,
                      TensorState& state, int64_t step) {
  const int64_t shape[] = {static_cast<int64_t>(g.size())};
  StepContext ctx;
  ctx.step = step;
  Bytes payload;
  return ef.Encode(TensorView{g, shape}, state, ctx, &payload);
}

// The residual's bytes: equal bytes are equal bits, NaN and -0 included.
std::string ResidualBits(TensorState& state) {
  const absl::Span<float> e = *state.Find(kErrorFeedbackBuffer);
  return std::string(reinterpret_cast<const char*>(e.data()),
                     e.size() * sizeof(float));
}

TEST(ErrorFeedbackTest, RefusedStepLeavesTheResidualBitForBit) {
  constexpr size_t kN = 1000;
  ErrorFeedback ef(std::make_unique<RefusingCodec>(0.25f, /*refused=*/5));
  TensorState state, twin;
  for (int64_t step = 0; step < 5; ++step) {
    const std::vector<float> g = Normal(kN, 1.0f, 10 + step);
    ASSERT_TRUE(EncodeAt(ef, g, state, step).ok());
    ASSERT_TRUE(EncodeAt(ef, g, twin, step).ok());
  }
  const std::string before = ResidualBits(state);
  // Large against the residual: (e + g) - g is e rounded to g's scale.
  EXPECT_EQ(EncodeAt(ef, Normal(kN, 10.0f, 15), state, 5).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResidualBits(state), before);
  // The next step runs as if the refused one had never been.
  const std::vector<float> g = Normal(kN, 1.0f, 16);
  ASSERT_TRUE(EncodeAt(ef, g, state, 6).ok());
  ASSERT_TRUE(EncodeAt(ef, g, twin, 6).ok());
  EXPECT_EQ(ResidualBits(state), ResidualBits(twin));
}

TEST(ErrorFeedbackTest, NonFiniteSumIsRefusedAndLeavesTheResidualBitForBit) {
  // The rounding codec itself would code NaN and Inf (round(NaN) is NaN) and
  // leave them in the residual for good.
  constexpr size_t kN = 300;
  ErrorFeedback ef(std::make_unique<RoundingCodec>(0.25f, false));
  TensorState state, twin;
  for (int64_t step = 0; step < 3; ++step) {
    const std::vector<float> g = Normal(kN, 1.0f, 20 + step);
    ASSERT_TRUE(EncodeAt(ef, g, state, step).ok());
    ASSERT_TRUE(EncodeAt(ef, g, twin, step).ok());
  }
  const std::string before = ResidualBits(state);
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    std::vector<float> g = Normal(kN, 10.0f, 23);
    g[123] = bad;
    const absl::Status status = EncodeAt(ef, g, state, 3);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(status.message().find("first at index 123"), std::string::npos)
        << status;
    EXPECT_EQ(ResidualBits(state), before) << bad;
  }
  const std::vector<float> g = Normal(kN, 1.0f, 24);
  ASSERT_TRUE(EncodeAt(ef, g, state, 4).ok());
  ASSERT_TRUE(EncodeAt(ef, g, twin, 4).ok());
  EXPECT_EQ(ResidualBits(state), ResidualBits(twin));
}

TEST(ErrorFeedbackTest, OverflowingSumIsRefusedAndLeavesTheResidual) {
  // Rounding to multiples of 1e38 leaves e = 0.4e38 of 1.4e38; then
  // g + e = 3.2e38 + 0.4e38 overflows although both are finite.
  ErrorFeedback ef(std::make_unique<RoundingCodec>(1e38f, false));
  TensorState state;
  ASSERT_TRUE(EncodeAt(ef, {1.4e38f, 1.0f}, state, 0).ok());
  const std::string before = ResidualBits(state);
  EXPECT_EQ(EncodeAt(ef, {3.2e38f, 1.0f}, state, 1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResidualBits(state), before);
  EXPECT_TRUE(EncodeAt(ef, {-1e38f, 1.0f}, state, 2).ok());
}

TEST(ErrorFeedbackTest, ScratchServesTensorsOfEverySizeInTurn) {
  // The copy kept for a failing step comes from buffers shared across
  // tensors: a smaller tensor after a larger one, and the reverse, still
  // get the residual back exactly.
  ErrorFeedback ef(std::make_unique<RefusingCodec>(0.25f, /*refused=*/1));
  for (size_t n : {4000u, 10u, 70000u, 3u}) {
    TensorState state;
    ASSERT_TRUE(EncodeAt(ef, Normal(n, 1.0f, 30), state, 0).ok());
    const std::string before = ResidualBits(state);
    EXPECT_FALSE(EncodeAt(ef, Normal(n, 10.0f, 31), state, 1).ok());
    EXPECT_EQ(ResidualBits(state), before) << n;
  }
}

TEST(ErrorFeedbackTest, BadPayloadIsTheInnerCodecsError) {
  ErrorFeedback ef(std::make_unique<RoundingCodec>(1.0f, false));
  std::vector<float> acc(2, 0.0f);
  EXPECT_EQ(ef.DecodeAdd("garbage", 1.0f, absl::MakeSpan(acc)).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace gradcomp::codecs
