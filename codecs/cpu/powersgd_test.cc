#include "codecs/cpu/powersgd.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "codecs/cpu/linalg.h"
#include "codecs/cpu/parallel.h"
#include "codecs/registry.h"
#include "codecs/state.h"
#include "codecs/testing/conformance.h"
#include "codecs/testing/random_inputs.h"
#include "codecs/wire.h"
#include "gtest/gtest.h"

namespace gradcomp::codecs {
namespace {

using Matrix = std::vector<float>;

using testing::LowRank;
using testing::Normal;

double Norm(const Matrix& a) {
  double s = 0;
  for (float x : a) s += static_cast<double>(x) * x;
  return std::sqrt(s);
}

double RelDistance(const Matrix& a, const Matrix& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    s += d * d;
  }
  return std::sqrt(s) / Norm(b);
}

Matrix Mean(const std::vector<Matrix>& grads) {
  Matrix mean(grads[0].size(), 0.0f);
  for (size_t i = 0; i < mean.size(); ++i) {
    double s = 0;
    for (const Matrix& g : grads) s += g[i];
    mean[i] = static_cast<float>(s / grads.size());
  }
  return mean;
}

std::unique_ptr<PowerSgdCodec> Make(CodecParams params = {}) {
  auto codec = PowerSgdCodec::Create(params);
  EXPECT_TRUE(codec.ok()) << codec.status();
  return std::move(codec).value();
}

testing::SimulatedStep Step(const Codec& codec,
                            const std::vector<Matrix>& grads,
                            std::vector<int64_t> shape,
                            std::vector<TensorState>& states, int64_t step) {
  StepContext ctx;
  ctx.seed = 99;
  ctx.tensor_id = 5;
  ctx.step = step;
  absl::StatusOr<testing::SimulatedStep> result =
      testing::SimulateStep(codec, grads, shape, states, ctx);
  EXPECT_TRUE(result.ok()) << result.status();
  return std::move(result).value();
}

TEST(PowerSgdTest, PlanFollowsRankShapeAndCompressionRate) {
  PowerSgdOptions o;  // rank 2, rate 2
  EXPECT_TRUE(PlanPowerSgd(o, {1000}).dense());
  EXPECT_TRUE(PlanPowerSgd(o, {0, 7}).dense());
  // 4 x 33: 132 < 2 * 2 * 37.
  EXPECT_TRUE(PlanPowerSgd(o, {4, 33}).dense());
  const PowerSgdPlan conv = PlanPowerSgd(o, {64, 32, 3, 3});
  EXPECT_EQ(conv.rows, 64);
  EXPECT_EQ(conv.cols, 288);
  EXPECT_EQ(conv.rank, 2);
  o.rank = 100;
  o.min_compression_rate = 0;
  EXPECT_EQ(PlanPowerSgd(o, {5, 40}).rank, 5);
}

TEST(PowerSgdTest, RejectsBadParameters) {
  EXPECT_FALSE(PowerSgdCodec::Create(CodecParams({{"rank", "0"}})).ok());
  EXPECT_FALSE(
      PowerSgdCodec::Create(CodecParams({{"min_compression_rate", "-1"}}))
          .ok());
  EXPECT_FALSE(PowerSgdCodec::Create(CodecParams({{"rnak", "2"}})).ok());
}

TEST(PowerSgdTest, PayloadsAreTheDocumentedFactors) {
  const auto codec = Make();
  std::vector<TensorState> states(1);
  const testing::SimulatedStep step =
      Step(*codec, {Normal(30 * 50, 1)}, {30, 5, 10}, states, 0);
  ASSERT_EQ(step.payloads.size(), 2u);
  for (int round = 0; round < 2; ++round) {
    absl::StatusOr<ParsedPayload> p = PeekPayload(step.payloads[round][0]);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->header.flags, kFlagDenseBody);
    EXPECT_EQ(p->header.round, round);
    ASSERT_EQ(p->params.size(), 16u);
    EXPECT_EQ(p->params[0], 1);  // f32
    EXPECT_EQ(p->params[1], 1);  // low rank
    uint32_t rank;
    uint64_t rows;
    std::memcpy(&rank, p->params.data() + 4, 4);
    std::memcpy(&rows, p->params.data() + 8, 8);
    EXPECT_EQ(rank, 2u);
    EXPECT_EQ(rows, 30u);
    EXPECT_EQ(p->body.size(), 4u * 2 * (round == 0 ? 30 : 50));
  }
}

TEST(PowerSgdTest, ExactWhenTheMeanHasRankAtMostR) {
  // Each worker's matrix is full rank, but the noise cancels in the mean,
  // whose rank is r (2) or less (1, where P has a dependent column).
  constexpr int64_t kRows = 40, kCols = 70;
  for (int true_rank : {1, 2}) {
    const Matrix low = LowRank(kRows, kCols, true_rank, 3);
    const Matrix noise = Normal(kRows * kCols, 4);
    std::vector<Matrix> grads(3, low);
    for (size_t i = 0; i < low.size(); ++i) {
      grads[0][i] += noise[i];
      grads[1][i] -= noise[i];
    }
    const auto codec = Make();
    std::vector<TensorState> states(3);
    const testing::SimulatedStep step =
        Step(*codec, grads, {kRows, kCols}, states, 0);
    // fp32 products over 70-element rows: ~1e-6 relative.
    EXPECT_LT(RelDistance(step.out[0], Mean(grads)), 2e-5) << true_rank;
  }
}

TEST(PowerSgdTest, WorkersCompressLikeOneWorkerWithTheirMean) {
  constexpr int64_t kRows = 33, kCols = 64;
  std::vector<Matrix> grads;
  for (uint32_t w = 0; w < 4; ++w)
    grads.push_back(Normal(kRows * kCols, 10 + w));
  const auto codec = Make(CodecParams({{"rank", "3"}}));
  std::vector<TensorState> many(4), one(1);
  // Two steps: the second uses the warm start and the residuals, which are
  // linear in the inputs too (the mean residual is the one worker's).
  for (int64_t s = 0; s < 2; ++s) {
    const testing::SimulatedStep joint =
        Step(*codec, grads, {kRows, kCols}, many, s);
    const testing::SimulatedStep alone =
        Step(*codec, {Mean(grads)}, {kRows, kCols}, one, s);
    EXPECT_LT(RelDistance(joint.out[0], alone.out[0]), 1e-5) << s;
    // The workers' own decodes average to the output.
    EXPECT_LT(RelDistance(Mean(joint.own), joint.out[0]), 1e-5) << s;
  }
}

TEST(PowerSgdTest, OneWorkerOutputPlusNewErrorIsTheInputPlusOldError) {
  constexpr int64_t kRows = 20, kCols = 30;
  const auto codec = Make();
  std::vector<TensorState> states(1);
  Matrix error(kRows * kCols, 0.0f);
  for (int64_t s = 0; s < 5; ++s) {
    const Matrix g = Normal(kRows * kCols, 20 + s);
    const testing::SimulatedStep step =
        Step(*codec, {g}, {kRows, kCols}, states, s);
    const absl::Span<float> new_error = *states[0].Find(kPowerSgdErrorBuffer);
    for (size_t i = 0; i < g.size(); ++i) {
      const float input = g[i] + error[i];
      ASSERT_NEAR(step.out[0][i] + new_error[i], input,
                  1e-6f * (1 + std::fabs(input)))
          << s << " " << i;
    }
    error.assign(new_error.begin(), new_error.end());
    // The error is what a rank-2 approximation cannot hold: not zero.
    EXPECT_GT(Norm(error), 0.1 * Norm(g));
  }
}

// Large enough for several bands of rows and for threads (2^20 values):
// 1200 x 1000 makes 19 bands of 65 rows.
constexpr int64_t kBigRows = 1200, kBigCols = 1000;

TEST(PowerSgdTest, BandedLargeMatrixIsExactAtRankRAndLosesNothing) {
  const Matrix low = LowRank(kBigRows, kBigCols, 2, 30);
  const Matrix noise = Normal(kBigRows * kBigCols, 31);
  std::vector<Matrix> grads(2, low);
  for (size_t i = 0; i < low.size(); ++i) {
    grads[0][i] += noise[i];
    grads[1][i] -= noise[i];
  }
  const auto codec = Make();
  std::vector<TensorState> states(2);
  const testing::SimulatedStep step =
      Step(*codec, grads, {kBigRows, kBigCols}, states, 0);
  // fp32 products over 1000-element rows, summed across bands.
  EXPECT_LT(RelDistance(step.out[0], Mean(grads)), 2e-5);
  // One worker: output plus residual is the input, element by element.
  std::vector<TensorState> one(1);
  const testing::SimulatedStep alone =
      Step(*codec, {noise}, {kBigRows, kBigCols}, one, 0);
  const absl::Span<float> error = *one[0].Find(kPowerSgdErrorBuffer);
  for (size_t i = 0; i < noise.size(); ++i) {
    ASSERT_NEAR(alone.out[0][i] + error[i], noise[i],
                1e-6f * (1 + std::fabs(noise[i])))
        << i;
  }
}

TEST(PowerSgdTest, ResultsDoNotDependOnTheNumberOfThreads) {
  const std::vector<Matrix> grads = {Normal(kBigRows * kBigCols, 40),
                                     Normal(kBigRows * kBigCols, 41)};
  const auto codec = Make(CodecParams({{"rank", "3"}}));
  // Two steps: the second adds the residual and starts from the warm Q.
  const auto run = [&](int threads) {
    ScopedParallelThreads forced(threads);
    std::vector<TensorState> states(2);
    std::vector<testing::SimulatedStep> steps;
    for (int64_t s = 0; s < 2; ++s) {
      steps.push_back(Step(*codec, grads, {kBigRows, kBigCols}, states, s));
    }
    const absl::Span<float> error = *states[1].Find(kPowerSgdErrorBuffer);
    return std::make_pair(std::move(steps), Matrix(error.begin(), error.end()));
  };
  const auto [steps, error] = run(1);
  for (int threads : {2, 3, 8}) {
    const auto [threaded_steps, threaded_error] = run(threads);
    for (size_t s = 0; s < steps.size(); ++s) {
      EXPECT_TRUE(threaded_steps[s].payloads == steps[s].payloads)
          << threads << " threads, step " << s;
      EXPECT_TRUE(threaded_steps[s].out == steps[s].out)
          << threads << " threads, step " << s;
      EXPECT_TRUE(threaded_steps[s].own == steps[s].own)
          << threads << " threads, step " << s;
    }
    EXPECT_TRUE(threaded_error == error) << threads << " threads";
  }
}

TEST(PowerSgdTest, ZeroStepDoesNotStallTheWarmStart) {
  // A zero gradient makes Q_mean zero; the next step must draw a fresh Q
  // rather than keep projecting on nothing.
  constexpr int64_t kRows = 16, kCols = 48;
  const auto codec = Make();
  std::vector<TensorState> states(2);
  const Matrix zero(kRows * kCols, 0.0f);
  const testing::SimulatedStep first =
      Step(*codec, {zero, zero}, {kRows, kCols}, states, 0);
  for (float v : first.out[0]) ASSERT_EQ(v, 0.0f);
  const Matrix low = LowRank(kRows, kCols, 2, 30);
  const testing::SimulatedStep second =
      Step(*codec, {low, low}, {kRows, kCols}, states, 1);
  EXPECT_LT(RelDistance(second.out[0], low), 2e-5);
}

TEST(PowerSgdTest, WarmStartConvergesToTheBestRankRApproximation) {
  // The same matrix every step, residual cleared: warm-started power
  // iteration approaches the truncated SVD's error; a fresh Q every step
  // stays at one power step's, which is larger.
  constexpr int64_t kRows = 30, kCols = 60;
  // Random factors weighted 1, 1/2, 1/4, ...: a decaying spectrum.
  Matrix m(kRows * kCols, 0.0f);
  const Matrix u = Normal(kRows * kRows, 40), v = Normal(kCols * kRows, 41);
  for (int64_t k = 0; k < kRows; ++k) {
    const float w = std::pow(0.5f, static_cast<float>(k));
    for (int64_t i = 0; i < kRows; ++i) {
      for (int64_t j = 0; j < kCols; ++j) {
        m[i * kCols + j] += w * u[i * kRows + k] * v[j * kRows + k];
      }
    }
  }
  double warm_error = 0, cold_error = 0;
  for (bool warm : {true, false}) {
    const auto codec =
        Make(CodecParams({{"warm_start", warm ? "true" : "false"}}));
    std::vector<TensorState> states(1);
    double error = 0;
    for (int64_t s = 0; s < 30; ++s) {
      const testing::SimulatedStep step =
          Step(*codec, {m}, {kRows, kCols}, states, s);
      error = RelDistance(step.out[0], m);
      absl::Span<float> residual = *states[0].Find(kPowerSgdErrorBuffer);
      std::fill(residual.begin(), residual.end(), 0.0f);
    }
    (warm ? warm_error : cold_error) = error;
    EXPECT_EQ(states[0].Find(kPowerSgdQBuffer).has_value(), warm);
  }
  EXPECT_LT(warm_error, 0.9 * cold_error);
}

TEST(PowerSgdTest, ResidualsStayBoundedOverAThousandSteps) {
  constexpr int64_t kRows = 16, kCols = 32;
  const auto codec = Make();
  std::vector<TensorState> states(1);
  std::vector<double> ratio;
  for (int64_t s = 0; s < 1000; ++s) {
    const Matrix g = Normal(kRows * kCols, 1000 + s);
    Step(*codec, {g}, {kRows, kCols}, states, s);
    ratio.push_back(Norm(Matrix(states[0].Find(kPowerSgdErrorBuffer)->begin(),
                                states[0].Find(kPowerSgdErrorBuffer)->end())) /
                    Norm(g));
  }
  double early = 0, late = 0, worst = 0;
  for (int s = 100; s < 200; ++s) early += ratio[s] / 100;
  for (int s = 900; s < 1000; ++s) late += ratio[s] / 100;
  for (double r : ratio) worst = std::max(worst, r);
  // Rank 2 of 16 keeps a fraction of each step; the residual settles at a
  // few gradient norms instead of growing like sqrt(steps) (which would
  // make the late mean ~2.2x the early one).
  EXPECT_LT(late, 1.3 * early);
  EXPECT_LT(worst, 10.0);
}

TEST(PowerSgdTest, SmallAndOneDimensionalTensorsGoDenseAndExact) {
  const auto codec = Make();
  for (const std::vector<int64_t>& shape :
       std::vector<std::vector<int64_t>>{{100}, {4, 33}}) {
    const size_t n = shape.size() == 1 ? 100 : 132;
    std::vector<TensorState> states(2);
    const std::vector<Matrix> grads = {Normal(n, 50), Normal(n, 51)};
    const testing::SimulatedStep step = Step(*codec, grads, shape, states, 0);
    EXPECT_EQ(step.payloads.size(), 1u);
    const Matrix mean = Mean(grads);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_NEAR(step.out[0][i], mean[i], 1e-6f);
      ASSERT_EQ(step.own[1][i], grads[1][i]);
    }
    EXPECT_TRUE(states[0].buffers().empty());
  }
}

// The parameters may change between steps while the state stays with
// powersgd, so a tensor can go dense after low-rank steps left a residual.
// The dense step sends it with the gradient (M = g + e, exact) and drops
// it: nothing is owed after an exact step, and low-rank steps that come
// back later start without a residual (before, the dense steps left it
// untouched, to be added, stale, whenever low rank came back). The warm
// start's Q stays for those steps.
TEST(PowerSgdTest, ADenseStepSendsTheResidualLowRankStepsLeft) {
  constexpr int64_t kRows = 20, kCols = 30;
  const auto low_rank = Make();
  const auto dense = Make(CodecParams({{"min_compression_rate", "1000"}}));
  ASSERT_TRUE(PlanPowerSgd(dense->options(), {kRows, kCols}).dense());
  std::vector<TensorState> states(2);
  for (int64_t s = 0; s < 3; ++s) {
    Step(*low_rank,
         {Normal(kRows * kCols, 70 + s), Normal(kRows * kCols, 80 + s)},
         {kRows, kCols}, states, s);
  }
  const std::vector<Matrix> residual = {
      Matrix(states[0].Find(kPowerSgdErrorBuffer)->begin(),
             states[0].Find(kPowerSgdErrorBuffer)->end()),
      Matrix(states[1].Find(kPowerSgdErrorBuffer)->begin(),
             states[1].Find(kPowerSgdErrorBuffer)->end())};
  ASSERT_GT(Norm(residual[0]), 0.1);
  const std::vector<Matrix> grads = {Normal(kRows * kCols, 90),
                                     Normal(kRows * kCols, 91)};
  const testing::SimulatedStep step =
      Step(*dense, grads, {kRows, kCols}, states, 3);
  for (size_t i = 0; i < grads[0].size(); ++i) {
    const float m0 = grads[0][i] + residual[0][i];
    const float m1 = grads[1][i] + residual[1][i];
    ASSERT_EQ(step.own[0][i], m0) << i;
    ASSERT_NEAR(step.out[0][i], (m0 + m1) / 2, 1e-6f * (1 + std::fabs(m0)))
        << i;
  }
  for (const TensorState& state : states) {
    EXPECT_EQ(state.buffers().count(std::string(kPowerSgdErrorBuffer)), 0u);
    EXPECT_EQ(state.buffers().count(std::string(kPowerSgdQBuffer)), 1u);
  }
}

TEST(PowerSgdTest, BadSumsAndOutOfOrderCallsAreErrors) {
  const auto codec = Make();
  const Matrix g = Normal(20 * 30, 60);
  const int64_t shape[] = {20, 30};
  TensorState state;
  auto session = codec->Start(TensorView{g, shape}, state, StepContext());
  ASSERT_TRUE(session.ok());
  Matrix out(g.size());
  EXPECT_EQ((*session)->Finish(absl::MakeSpan(out)).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE((*session)->NextRound().ok());
  EXPECT_FALSE((*session)->NextRound().ok());
  RoundResult wrong_size;
  wrong_size.sum.assign(39, 1.0f);
  EXPECT_EQ((*session)->Absorb(wrong_size).code(),
            absl::StatusCode::kInvalidArgument);
  RoundResult not_finite;
  not_finite.sum.assign(40, 1.0f);
  not_finite.sum[3] = std::nanf("");
  EXPECT_EQ((*session)->Absorb(not_finite).code(),
            absl::StatusCode::kInvalidArgument);
  // A NaN gradient is refused before any state changes: after a full step,
  // the error-feedback and warm-start buffers stay as that step left them.
  std::vector<TensorState> states(1);
  Step(*codec, {g}, {20, 30}, states, 0);
  const auto after_step = states[0].buffers();
  ASSERT_FALSE(after_step.empty());
  Matrix bad = g;
  bad[7] = INFINITY;
  auto bad_session =
      codec->Start(TensorView{bad, shape}, states[0], StepContext());
  ASSERT_TRUE(bad_session.ok());
  EXPECT_EQ((*bad_session)->NextRound().status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(states[0].buffers(), after_step);
}

// The fp32 body of a round's payload.
Matrix Body(const Round& round) {
  const size_t offset = kWireHeaderBytes + 16;
  Matrix body((round.payload.size() - offset) / sizeof(float));
  std::memcpy(body.data(), round.payload.data() + offset,
              body.size() * sizeof(float));
  return body;
}

// Runs `session`'s P round as the only worker (the sum of P is its own P)
// and sets `p_hat` to P orthonormalised, as every rank's P_hat would be.
void AbsorbOwnP(CodecSession& session, int64_t rows, int rank, Matrix* p_hat) {
  absl::StatusOr<std::optional<Round>> p_round = session.NextRound();
  ASSERT_TRUE(p_round.ok() && p_round->has_value());
  *p_hat = Body(**p_round);
  RoundResult p_sum;
  p_sum.sum = *p_hat;
  ASSERT_TRUE(session.Absorb(std::move(p_sum)).ok());
  OrthonormalizeColumns(absl::MakeSpan(*p_hat), rows, rank);
}

TEST(PowerSgdTest, HugeSummedQIsRefusedAndChangesNoState) {
  // A 4 x 30 matrix at rank 4: P_hat is an orthogonal 4 x 4 matrix, whose
  // first row r has |r|_1 > 1. A summed Q whose every row is 3e38 * sign(r)
  // is finite, but P_hat Q^T is 3e38 |r|_1 in row 0: Inf.
  constexpr int64_t kRows = 4, kCols = 30;
  const auto codec =
      Make(CodecParams({{"rank", "4"}, {"min_compression_rate", "0"}}));
  const int64_t shape[] = {kRows, kCols};
  std::vector<TensorState> states(1);
  Step(*codec, {Normal(kRows * kCols, 70)}, {kRows, kCols}, states, 0);
  const auto before = states[0].buffers();
  ASSERT_EQ(before.size(), 2u);  // the residual and the warm start

  const Matrix g = Normal(kRows * kCols, 71);
  StepContext ctx;
  ctx.step = 1;
  auto session = codec->Start(TensorView{g, shape}, states[0], ctx);
  ASSERT_TRUE(session.ok());
  Matrix p_hat;
  ASSERT_NO_FATAL_FAILURE(AbsorbOwnP(**session, kRows, 4, &p_hat));
  ASSERT_GT(std::fabs(p_hat[0]) + std::fabs(p_hat[1]) + std::fabs(p_hat[2]) +
                std::fabs(p_hat[3]),
            1.2);
  ASSERT_TRUE((*session)->NextRound().ok());
  RoundResult q_sum;
  for (int64_t j = 0; j < kCols; ++j) {
    for (int k = 0; k < 4; ++k) {
      q_sum.sum.push_back(std::copysign(3e38f, p_hat[k]));
    }
  }
  const absl::Status status = (*session)->Absorb(std::move(q_sum));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("overflowed"), std::string::npos) << status;
  EXPECT_EQ(states[0].buffers(), before);
  Matrix out(g.size());
  EXPECT_FALSE((*session)->Finish(absl::MakeSpan(out)).ok());

  // The next step runs as if the refused one had never been.
  std::vector<TensorState> twin = {TensorState()};
  Step(*codec, {Normal(kRows * kCols, 70)}, {kRows, kCols}, twin, 0);
  const Matrix next = Normal(kRows * kCols, 72);
  const testing::SimulatedStep a =
      Step(*codec, {next}, {kRows, kCols}, states, 2);
  const testing::SimulatedStep b =
      Step(*codec, {next}, {kRows, kCols}, twin, 2);
  EXPECT_EQ(a.out[0], b.out[0]);
  EXPECT_EQ(states[0].buffers(), twin[0].buffers());
  for (float v : a.out[0]) ASSERT_TRUE(std::isfinite(v));
}

TEST(PowerSgdTest, LargeButRepresentableSummedQIsNotRefused) {
  // A summed Q whose every row is 2e38 * s, for the signs s that keep
  // P_hat s smallest: P_hat Q^T is at most 2e38 max_i |(P_hat s)_i|, finite,
  // though the cheap bound, 2e38 sum_k max_i |P_hat[i, k]| (at least 4e38:
  // a unit vector in R^4 has an entry of at least 1/2), cannot tell. The
  // exact check then lets the step through.
  constexpr int64_t kRows = 4, kCols = 30;
  const auto codec =
      Make(CodecParams({{"rank", "4"}, {"min_compression_rate", "0"}}));
  const int64_t shape[] = {kRows, kCols};
  TensorState state;
  const Matrix g = Normal(kRows * kCols, 73);
  auto session = codec->Start(TensorView{g, shape}, state, StepContext());
  ASSERT_TRUE(session.ok());
  Matrix p_hat;
  ASSERT_NO_FATAL_FAILURE(AbsorbOwnP(**session, kRows, 4, &p_hat));
  float signs[4] = {};
  double best = INFINITY;
  for (int pattern = 0; pattern < 16; ++pattern) {
    double largest = 0;
    for (int i = 0; i < kRows; ++i) {
      double row = 0;
      for (int k = 0; k < 4; ++k) {
        row += (pattern >> k & 1 ? -1.0 : 1.0) * p_hat[i * 4 + k];
      }
      largest = std::max(largest, std::fabs(row));
    }
    if (largest < best) {
      best = largest;
      for (int k = 0; k < 4; ++k) signs[k] = pattern >> k & 1 ? -1.0f : 1.0f;
    }
  }
  ASSERT_LT(best * 2e38, 3.3e38);
  ASSERT_TRUE((*session)->NextRound().ok());
  RoundResult q_sum;
  for (int64_t j = 0; j < kCols; ++j) {
    for (int k = 0; k < 4; ++k) q_sum.sum.push_back(signs[k] * 2e38f);
  }
  const absl::Status status = (*session)->Absorb(std::move(q_sum));
  ASSERT_TRUE(status.ok()) << status;
  Matrix out(g.size());
  ASSERT_TRUE((*session)->Finish(absl::MakeSpan(out)).ok());
  for (float v : out) ASSERT_TRUE(std::isfinite(v));
  const absl::Span<float> error = *state.Find(kPowerSgdErrorBuffer);
  for (float e : error) ASSERT_TRUE(std::isfinite(e));
}

}  // namespace
}  // namespace gradcomp::codecs
