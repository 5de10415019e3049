#include "codecs/cpu/sign.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "codecs/error_feedback.h"
#include "codecs/registry.h"
#include "codecs/state.h"
#include "codecs/testing/conformance.h"
#include "codecs/wire.h"
#include "gtest/gtest.h"

namespace gradcomp::codecs {
namespace {

using ::gradcomp::codecs::testing::SimulatedStep;
using ::gradcomp::codecs::testing::SimulateStep;

std::vector<float> Normal(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist;
  std::vector<float> x(n);
  for (float& v : x) v = dist(gen);
  return x;
}

std::unique_ptr<Codec> Make(absl::string_view name,
                            const CodecParams& params = CodecParams()) {
  CodecRegistry registry;
  EXPECT_TRUE(RegisterSignCodecs(registry).ok());
  auto codec = registry.Create(name, params);
  EXPECT_TRUE(codec.ok()) << codec.status();
  return std::move(codec).value();
}

absl::StatusOr<SimulatedStep> Step(const Codec& codec,
                                   const std::vector<std::vector<float>>& g,
                                   std::vector<TensorState>& states,
                                   int64_t step = 0) {
  const int64_t shape[] = {static_cast<int64_t>(g[0].size())};
  StepContext ctx;
  ctx.seed = 9;
  ctx.step = step;
  return SimulateStep(codec, g, shape, states, ctx);
}

double Mean(const std::vector<float>& x) {
  double s = 0;
  for (float v : x) s += std::fabs(v);
  return s / x.size();
}

TEST(SignSgdTest, DecodesToTheMeanMagnitudeTimesTheSignWithZeroPositive) {
  auto codec = Make("signsgd");
  const std::vector<float> g = {0.0f, -0.0f, 1.0f, -2.0f, 5.0f};
  std::vector<TensorState> states(1);
  absl::StatusOr<SimulatedStep> step = Step(*codec, {g}, states);
  ASSERT_TRUE(step.ok()) << step.status();
  // s = ||g||_1 / n = 8 / 5.
  const float s = 8.0f / 5.0f;
  EXPECT_EQ(step->own[0], std::vector<float>({s, s, s, -s, s}));
  EXPECT_EQ(step->out[0], step->own[0]);
  // Header, then f32 s, then one word of signs: only bit 3 set.
  const Bytes& p = step->payloads[0][0];
  ASSERT_EQ(p.size(), kWireHeaderBytes + 4 + 8);
  float scale;
  std::memcpy(&scale, p.data() + kWireHeaderBytes, 4);
  EXPECT_EQ(scale, s);
  EXPECT_EQ(p.substr(kWireHeaderBytes + 4),
            std::string("\x08\0\0\0\0\0\0\0", 8));
}

TEST(SignSgdTest, MajorityVoteOfThreeWorkers) {
  auto codec = Make("signsgd");
  // Per element the votes are (+,+,+), (+,+,-), (+,-,-), (-,-,-), and a
  // huge minority value that a mean would follow but a vote ignores.
  const std::vector<std::vector<float>> g = {
      {1, 1, 1, -1, -100}, {2, 2, -2, -2, 1}, {3, -3, -3, -3, 1}};
  std::vector<TensorState> states(3);
  absl::StatusOr<SimulatedStep> step = Step(*codec, g, states);
  ASSERT_TRUE(step.ok()) << step.status();
  const float s =
      static_cast<float>((Mean(g[0]) + Mean(g[1]) + Mean(g[2])) / 3);
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(step->out[r].size(), 5u);
    EXPECT_FLOAT_EQ(step->out[r][0], s);
    EXPECT_FLOAT_EQ(step->out[r][1], s);
    EXPECT_FLOAT_EQ(step->out[r][2], -s);
    EXPECT_FLOAT_EQ(step->out[r][3], -s);
    EXPECT_FLOAT_EQ(step->out[r][4], s);
  }
}

TEST(SignSgdTest, TiesOfFourWorkersGiveZero) {
  auto codec = Make("signsgd");
  const std::vector<std::vector<float>> g = {
      {1, 1, 1, -1}, {1, 1, -1, -1}, {-1, -1, -1, 1}, {-1, 1, -1, 0}};
  std::vector<TensorState> states(4);
  absl::StatusOr<SimulatedStep> step = Step(*codec, g, states);
  ASSERT_TRUE(step.ok()) << step.status();
  // Votes: 0, +2, -2, 0 (the zero counts as +1).
  const float s = static_cast<float>(
      (Mean(g[0]) + Mean(g[1]) + Mean(g[2]) + Mean(g[3])) / 4);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(step->out[r], std::vector<float>({0.0f, s, -s, 0.0f}))
        << "rank " << r;
  }
}

TEST(SignSgdTest, VoteMatchesANaiveTallyOnALargeTensor) {
  // Large enough for the threaded paths of packing, tallying and voting.
  constexpr size_t kN = 3'000'003;
  constexpr int kWorld = 4;
  auto codec = Make("signsgd");
  std::vector<std::vector<float>> g;
  for (int r = 0; r < kWorld; ++r) g.push_back(Normal(kN, 40 + r));
  std::vector<TensorState> states(kWorld);
  absl::StatusOr<SimulatedStep> step = Step(*codec, g, states);
  ASSERT_TRUE(step.ok()) << step.status();
  double s = 0;
  for (int r = 0; r < kWorld; ++r) s += Mean(g[r]);
  const float scale = static_cast<float>(s / kWorld);
  size_t ties = 0;
  for (size_t i = 0; i < kN; ++i) {
    int tally = 0;
    for (int r = 0; r < kWorld; ++r) tally += g[r][i] < 0 ? -1 : 1;
    ties += tally == 0;
    const float want = tally > 0 ? scale : (tally < 0 ? -scale : 0.0f);
    ASSERT_NEAR(step->out[0][i], want, 1e-6f * scale) << i;
  }
  // 4 independent fair signs tie with probability 6/16.
  EXPECT_NEAR(static_cast<double>(ties) / kN, 0.375, 0.002);
}

TEST(SignSgdTest, AVoteWithABadPayloadFailsAndLeavesTheOutputAlone) {
  auto codec = Make("signsgd");
  const auto& single = dynamic_cast<const SingleRoundCodec&>(*codec);
  std::vector<TensorState> states(2);
  absl::StatusOr<SimulatedStep> step =
      Step(*codec, {Normal(100, 1), Normal(100, 2)}, states);
  ASSERT_TRUE(step.ok()) << step.status();
  std::vector<Bytes> payloads = step->payloads[0];
  payloads[1].back() = '\xff';  // padding bits of the last word
  std::vector<float> out(100, 7.0f);
  const absl::Status s =
      single.FinishGather(payloads, StepContext(), absl::MakeSpan(out));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("rank 1"), absl::string_view::npos) << s;
  EXPECT_EQ(out, std::vector<float>(100, 7.0f));
}

TEST(SignSgdTest, NonFiniteGradientIsRejected) {
  auto codec = Make("signsgd");
  for (float bad : {std::nanf(""), INFINITY}) {
    std::vector<TensorState> states(1);
    std::vector<float> g = Normal(10, 5);
    g[3] = bad;
    absl::StatusOr<SimulatedStep> step = Step(*codec, {g}, states);
    EXPECT_EQ(step.status().code(), absl::StatusCode::kInvalidArgument);
  }
}

// g[0] and g[8] share an fp32 lane of the |g| sum, which overflows to Inf
// though ||g||_1 / n = 4e38 / 9 is finite: summed again in double.
TEST(SignSgdTest, FiniteValuesWhoseLaneSumOverflowsAreSent) {
  auto codec = Make("signsgd");
  std::vector<float> g(9, 0.0f);
  g[0] = 2e38f;
  g[8] = -2e38f;
  std::vector<TensorState> states(1);
  absl::StatusOr<SimulatedStep> step = Step(*codec, {g}, states);
  ASSERT_TRUE(step.ok()) << step.status();
  const float s = static_cast<float>(
      (std::fabs(double{g[0]}) + std::fabs(double{g[8]})) / 9);
  EXPECT_EQ(step->own[0][0], s);
  EXPECT_EQ(step->own[0][8], -s);
}

TEST(SignumTest, SendsTheSignOfTheMomentumAndKeepsIt) {
  auto codec = Make("signum", CodecParams({{"momentum", "0.5"}}));
  std::vector<TensorState> states(1);
  // m1 = 0.5 g1 = (1, -1); m2 = 0.5 m1 + 0.5 g2 = (0.5 - 0.75, -0.5 + 0.25).
  ASSERT_TRUE(Step(*codec, {{2.0f, -2.0f}}, states, 0).ok());
  absl::StatusOr<SimulatedStep> step = Step(*codec, {{-1.5f, 0.5f}}, states, 1);
  ASSERT_TRUE(step.ok()) << step.status();
  const std::optional<absl::Span<float>> m =
      states[0].Find(SignCodec::kMomentumBuffer);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(std::vector<float>(m->begin(), m->end()),
            std::vector<float>({-0.25f, -0.25f}));
  // The gradient's second element is positive; the momentum's is not.
  EXPECT_EQ(step->own[0], std::vector<float>({-0.25f, -0.25f}));
}

TEST(SignumTest, VotesOnMomentumSigns) {
  auto codec = Make("signum");
  std::vector<TensorState> states(3);
  absl::StatusOr<SimulatedStep> step =
      Step(*codec, {{1, -1}, {1, 1}, {-1, 1}}, states);
  ASSERT_TRUE(step.ok()) << step.status();
  // m = 0.1 g: s_r = 0.1 each.
  EXPECT_FLOAT_EQ(step->out[0][0], 0.1f);
  EXPECT_FLOAT_EQ(step->out[0][1], 0.1f);
}

TEST(SignumTest, NonFiniteGradientIsRejectedAndTheMomentumRestarts) {
  auto codec = Make("signum");
  std::vector<TensorState> states(1);
  ASSERT_TRUE(Step(*codec, {{1.0f, 2.0f}}, states, 0).ok());
  absl::StatusOr<SimulatedStep> step =
      Step(*codec, {{std::nanf(""), 2.0f}}, states, 1);
  EXPECT_EQ(step.status().code(), absl::StatusCode::kInvalidArgument);
  const std::optional<absl::Span<float>> m =
      states[0].Find(SignCodec::kMomentumBuffer);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(std::vector<float>(m->begin(), m->end()),
            std::vector<float>({0.0f, 0.0f}));
}

TEST(SignumTest, RejectsBadParameters) {
  CodecRegistry registry;
  ASSERT_TRUE(RegisterSignCodecs(registry).ok());
  for (const char* m : {"1", "-0.1", "nan"}) {
    EXPECT_EQ(registry.Create("signum", CodecParams({{"momentum", m}}))
                  .status()
                  .code(),
              absl::StatusCode::kInvalidArgument)
        << m;
  }
  EXPECT_EQ(registry.Create("signsgd", CodecParams({{"momentum", "0.9"}}))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(EfSignTest, IsErrorFeedbackAroundTheScaledSign) {
  auto codec = Make("efsign");
  ASSERT_NE(dynamic_cast<const ErrorFeedback*>(codec.get()), nullptr);
  EXPECT_FALSE(codec->info().majority_vote);
  EXPECT_TRUE(codec->info().stateful);
  constexpr size_t kN = 1000;
  std::vector<TensorState> states(1);
  std::vector<float> e_old(kN, 0.0f);
  for (int64_t t = 0; t < 5; ++t) {
    const std::vector<float> g = Normal(kN, 50 + t);
    absl::StatusOr<SimulatedStep> step = Step(*codec, {g}, states, t);
    ASSERT_TRUE(step.ok()) << step.status();
    const absl::Span<float> e_new = *states[0].Find(kErrorFeedbackBuffer);
    // p = g + e; D = ||p||_1/n sign(p); g + e_old = D + e_new.
    std::vector<float> p(kN);
    for (size_t i = 0; i < kN; ++i) p[i] = g[i] + e_old[i];
    const float s = static_cast<float>(Mean(p));
    for (size_t i = 0; i < kN; ++i) {
      ASSERT_NEAR(step->own[0][i], p[i] < 0 ? -s : s, 1e-6f * s) << i;
      ASSERT_NEAR(p[i], step->own[0][i] + e_new[i], 1e-5f) << i;
    }
    e_old.assign(e_new.begin(), e_new.end());
  }
}

TEST(EfSignTest, AveragesTheWorkersDecodes) {
  auto codec = Make("efsign");
  std::vector<TensorState> states(3);
  const std::vector<std::vector<float>> g = {
      {1, 1, -5}, {1, -1, 1}, {-1, -1, 1}};
  absl::StatusOr<SimulatedStep> step = Step(*codec, g, states);
  ASSERT_TRUE(step.ok()) << step.status();
  for (size_t i = 0; i < 3; ++i) {
    const float mean =
        (step->own[0][i] + step->own[1][i] + step->own[2][i]) / 3.0f;
    EXPECT_NEAR(step->out[0][i], mean, 1e-6f) << i;
  }
}

TEST(EfSignTest, BucketsScaleEachRunOfValuesOnItsOwn) {
  auto codec = Make("efsign", CodecParams({{"bucket", "64"}}));
  EXPECT_EQ(codec->info().params, std::vector<std::string>{"bucket"});
  // 200 values: buckets [0, 64), [64, 128), [128, 192), [192, 200), the
  // second one 100 times larger than the rest.
  constexpr size_t kN = 200;
  std::vector<TensorState> states(1);
  std::vector<float> e_old(kN, 0.0f);
  for (int64_t t = 0; t < 3; ++t) {
    std::vector<float> g = Normal(kN, 70 + t);
    for (size_t i = 64; i < 128; ++i) g[i] *= 100.0f;
    absl::StatusOr<SimulatedStep> step = Step(*codec, {g}, states, t);
    ASSERT_TRUE(step.ok()) << step.status();
    const Bytes& payload = step->payloads[0][0];
    // Header, 8 parameter bytes, 4 scales, 4 words of signs.
    EXPECT_EQ(payload.size(), kWireHeaderBytes + 8 + 4 * 4 + 32);
    const absl::Span<float> e_new = *states[0].Find(kErrorFeedbackBuffer);
    std::vector<float> p(kN);
    for (size_t i = 0; i < kN; ++i) p[i] = g[i] + e_old[i];
    for (size_t begin = 0; begin < kN; begin += 64) {
      const size_t end = std::min(kN, begin + 64);
      const std::vector<float> bucket(p.begin() + begin, p.begin() + end);
      const float s = static_cast<float>(Mean(bucket));
      for (size_t i = begin; i < end; ++i) {
        ASSERT_NEAR(step->own[0][i], p[i] < 0 ? -s : s, 1e-6f * s) << i;
        ASSERT_NEAR(p[i], step->own[0][i] + e_new[i], 1e-5f * s) << i;
      }
    }
    e_old.assign(e_new.begin(), e_new.end());
  }
}

TEST(EfSignTest, BucketsLowerTheErrorOfUnevenRows) {
  // Rows of 64 values whose sizes alternate 1 and 10: one scale for the
  // whole tensor overstates the small rows tenfold; one scale per row
  // (bucket 64) keeps only the spread of |g| within a row.
  std::vector<float> g = Normal(64 * 16, 5);
  for (size_t i = 0; i < g.size(); ++i) g[i] *= (i / 64) % 2 ? 10.0f : 1.0f;
  double small_rows[2], all_rows[2];
  for (int bucketed = 0; bucketed < 2; ++bucketed) {
    auto codec = Make(
        "efsign", bucketed ? CodecParams({{"bucket", "64"}}) : CodecParams());
    std::vector<TensorState> states(1);
    absl::StatusOr<SimulatedStep> step = Step(*codec, {g}, states);
    ASSERT_TRUE(step.ok()) << step.status();
    small_rows[bucketed] = all_rows[bucketed] = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      const double e = std::pow(step->out[0][i] - g[i], 2);
      all_rows[bucketed] += e;
      if ((i / 64) % 2 == 0) small_rows[bucketed] += e;
    }
  }
  EXPECT_LT(small_rows[1], 0.1 * small_rows[0]);
  EXPECT_LT(all_rows[1], all_rows[0]);
}

TEST(EfSignTest, RejectsBadBuckets) {
  CodecRegistry registry;
  ASSERT_TRUE(RegisterSignCodecs(registry).ok());
  for (const char* bucket : {"-64", "32", "100", "2097152", "x"}) {
    EXPECT_EQ(registry.Create("efsign", CodecParams({{"bucket", bucket}}))
                  .status()
                  .code(),
              absl::StatusCode::kInvalidArgument)
        << bucket;
  }
  EXPECT_EQ(registry.Create("signsgd", CodecParams({{"bucket", "64"}}))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(EfSignTest, DecoderRejectsBadBucketParameters) {
  auto codec = Make("efsign", CodecParams({{"bucket", "64"}}));
  std::vector<TensorState> states(1);
  absl::StatusOr<SimulatedStep> step = Step(*codec, {Normal(130, 3)}, states);
  ASSERT_TRUE(step.ok()) << step.status();
  const Bytes& good = step->payloads[0][0];
  const auto& single = dynamic_cast<const SingleRoundCodec&>(*codec);
  std::vector<float> acc(130, 0.0f);
  ASSERT_TRUE(single.DecodeAdd(good, 1.0f, absl::MakeSpan(acc)).ok());
  for (uint32_t bucket : {0u, 32u, 96u, 128u}) {
    Bytes bad = good;
    std::memcpy(bad.data() + kWireHeaderBytes, &bucket, 4);
    EXPECT_EQ(single.DecodeAdd(bad, 1.0f, absl::MakeSpan(acc)).code(),
              absl::StatusCode::kInvalidArgument)
        << bucket;
  }
  // A negative scale in the second bucket.
  Bytes bad = good;
  const float negative = -1.0f;
  std::memcpy(bad.data() + kWireHeaderBytes + 8 + 4, &negative, 4);
  EXPECT_EQ(single.DecodeAdd(bad, 1.0f, absl::MakeSpan(acc)).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SignCodecsTest, DecodersRejectBadScalesAndForeignIds) {
  auto signsgd = Make("signsgd");
  auto signum = Make("signum");
  const auto& single = dynamic_cast<const SingleRoundCodec&>(*signsgd);
  std::vector<TensorState> states(1);
  absl::StatusOr<SimulatedStep> step = Step(*signsgd, {Normal(70, 8)}, states);
  ASSERT_TRUE(step.ok()) << step.status();
  const Bytes& good = step->payloads[0][0];
  for (float scale : {-1.0f, std::nanf(""), INFINITY}) {
    Bytes bad = good;
    std::memcpy(bad.data() + kWireHeaderBytes, &scale, 4);
    std::vector<float> acc(70, 0.0f);
    EXPECT_EQ(single.DecodeAdd(bad, 1.0f, absl::MakeSpan(acc)).code(),
              absl::StatusCode::kInvalidArgument)
        << scale;
  }
  // A signsgd payload is not a signum one, though the layouts agree.
  std::vector<float> acc(70, 0.0f);
  EXPECT_EQ(dynamic_cast<const SingleRoundCodec&>(*signum)
                .DecodeAdd(good, 1.0f, absl::MakeSpan(acc))
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(EfSignTest, ParseSignPayloadGivesTheBucketScalesAndSigns) {
  const SignCodec codec(SignCodec::Variant::kEfSign, 0.0f, /*bucket=*/64);
  std::vector<float> g(130, 2.0f);
  g[0] = -4.0f;
  g[129] = -8.0f;
  const int64_t shape[] = {130};
  TensorState state;
  Bytes payload;
  ASSERT_TRUE(
      codec.Encode(TensorView{g, shape}, state, StepContext{}, &payload).ok());
  const absl::StatusOr<SignPayload> p =
      ParseSignPayload(SignCodec::Variant::kEfSign, payload, 130);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->bucket, 64u);
  EXPECT_EQ(p->scales, (std::vector<float>{(4.0f + 63 * 2.0f) / 64, 2.0f,
                                           (2.0f + 8.0f) / 2}));
  // The header, the 8 parameter bytes, the 3 scales, then 3 words of signs.
  EXPECT_EQ(p->body.data(), payload.data() + kWireHeaderBytes + 8);
  EXPECT_EQ(p->body.size(), 4u * 3 + 24);
  EXPECT_EQ(p->signs(), p->body.data() + 12);

  // An efsign payload is not a signsgd one.
  const absl::Status s =
      ParseSignPayload(SignCodec::Variant::kSignSgd, payload, 130).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace gradcomp::codecs
