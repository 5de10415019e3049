#include "codecs/cpu/randomk.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
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

std::unique_ptr<Codec> Make(std::map<std::string, std::string> params) {
  CodecRegistry registry;
  EXPECT_TRUE(RegisterRandomK(registry).ok());
  auto codec = registry.Create("randomk", CodecParams(std::move(params)));
  EXPECT_TRUE(codec.ok()) << codec.status();
  return std::move(codec).value();
}

int PopCount(const std::vector<uint64_t>& bitmap) {
  int count = 0;
  for (uint64_t w : bitmap) count += __builtin_popcountll(w);
  return count;
}

StepContext Context(int64_t step) {
  StepContext ctx;
  ctx.seed = 99;
  ctx.tensor_id = TensorId("layer.weight");
  ctx.step = step;
  return ctx;
}

TEST(RandomKTest, BitmapHoldsExactlyKIndicesBelowN) {
  for (uint64_t n : {1u, 63u, 64u, 65u, 1000u, 4097u}) {
    for (uint64_t k : {uint64_t{0}, uint64_t{1}, n / 3, n / 2 + 1, n - 1, n}) {
      const std::vector<uint64_t> bitmap =
          DrawRandomKBitmap(n, k, PhiloxStream(1, 2, 3, 0));
      ASSERT_EQ(bitmap.size(), (n + 63) / 64);
      EXPECT_EQ(PopCount(bitmap), static_cast<int>(k)) << n << " " << k;
      if (n % 64 != 0) {
        EXPECT_EQ(bitmap.back() >> (n % 64), 0u) << n << " " << k;
      }
    }
  }
}

TEST(RandomKTest, SameKeySameIndicesOtherStepOtherIndices) {
  const PhiloxStream a(7, 8, 9, 0);
  EXPECT_EQ(DrawRandomKBitmap(5000, 50, a), DrawRandomKBitmap(5000, 50, a));
  EXPECT_NE(DrawRandomKBitmap(5000, 50, a),
            DrawRandomKBitmap(5000, 50, PhiloxStream(7, 8, 10, 0)));
  EXPECT_NE(DrawRandomKBitmap(5000, 50, a),
            DrawRandomKBitmap(5000, 50, PhiloxStream(7, 9, 9, 0)));
}

TEST(RandomKTest, EveryIndexAndPairIsEquallyLikely) {
  // Over T draws an index is kept Binomial(T, k/n) times and a pair
  // Binomial(T, k(k-1)/(n(n-1))) times. z-scores with the exact sd must stay
  // within 5 (over 10 + 45 cells, a false alarm has odds ~1e-5), and their
  // mean square near 1. k = 3 uses Floyd directly, k = 7 the complement.
  constexpr uint64_t n = 10;
  constexpr int kTrials = 40000;
  for (uint64_t k : {3u, 7u}) {
    std::vector<int> single(n, 0);
    std::vector<int> pair(n * n, 0);
    for (int t = 0; t < kTrials; ++t) {
      const uint64_t bits =
          DrawRandomKBitmap(n, k, PhiloxStream(5, 6, t, 0))[0];
      for (uint64_t i = 0; i < n; ++i) {
        if (((bits >> i) & 1) == 0) continue;
        ++single[i];
        for (uint64_t j = i + 1; j < n; ++j) pair[i * n + j] += (bits >> j) & 1;
      }
    }
    double z2 = 0;
    int cells = 0;
    auto check = [&](int count, double p) {
      const double z = (count - kTrials * p) / std::sqrt(kTrials * p * (1 - p));
      EXPECT_LT(std::fabs(z), 5.0) << "k " << k << " p " << p;
      z2 += z * z;
      ++cells;
    };
    const double p1 = static_cast<double>(k) / n;
    const double p2 = p1 * (k - 1.0) / (n - 1.0);
    for (uint64_t i = 0; i < n; ++i) {
      check(single[i], p1);
      for (uint64_t j = i + 1; j < n; ++j) check(pair[i * n + j], p2);
    }
    // 55 correlated squared z-scores: mean 1, sd at most ~0.3.
    EXPECT_NEAR(z2 / cells, 1.0, 0.6) << k;
  }
}

TEST(RandomKTest, RanksShareIndicesAndThePayloadsSum) {
  const auto codec = Make({{"ratio", "0.05"}});
  constexpr int kWorld = 3;
  const std::vector<int64_t> shape = {30, 41};
  const size_t n = 30 * 41;
  std::vector<std::vector<float>> grads;
  for (int r = 0; r < kWorld; ++r) grads.push_back(Normal(n, 40 + r));
  std::vector<TensorState> states(kWorld);
  absl::StatusOr<SimulatedStep> step =
      SimulateStep(*codec, grads, shape, states, Context(4));
  ASSERT_TRUE(step.ok()) << step.status();
  ASSERT_EQ(step->collectives[0], Collective::kSum);
  const size_t k = 62;  // ceil(0.05 * 1230)
  const float scale = static_cast<float>(n / 62.0);
  for (int r = 0; r < kWorld; ++r) {
    // Same key and k in every rank's parameter block: summable as they are.
    const auto parsed = PeekPayload(step->payloads[0][r]);
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(parsed->params, PeekPayload(step->payloads[0][0])->params);
    EXPECT_EQ(parsed->body.size(), 4 * k);
    size_t kept = 0;
    for (size_t i = 0; i < n; ++i) {
      const bool on_r = step->own[r][i] != 0;
      EXPECT_EQ(on_r, step->own[0][i] != 0) << "rank " << r << " index " << i;
      if (on_r) {
        ++kept;
        EXPECT_EQ(step->own[r][i], grads[r][i] * scale) << i;
      }
    }
    EXPECT_EQ(kept, k);
  }
  // The summed bodies scattered and divided by W equal the mean of what each
  // worker sent (up to the order of the fp32 additions).
  for (size_t i = 0; i < n; ++i) {
    const double mean =
        (step->own[0][i] + step->own[1][i] + step->own[2][i]) / 3.0;
    EXPECT_NEAR(step->out[0][i], mean, 1e-6 * (1 + std::fabs(mean))) << i;
  }
}

TEST(RandomKTest, ScaledEstimateIsUnbiased) {
  // X_i = (n/k) g_i B_i with B_i ~ Bernoulli(p = k/n): E X_i = g_i and
  // Var X_i = g_i^2 (1 - p) / p. Over T steps the mean of X_i has sd
  // sqrt(Var / T); each z-score must stay within 5.5 and their mean square
  // near 1 (mean of 500 squared normals: sd 0.063, a 4 sd band).
  const auto codec = Make({{"ratio", "0.2"}});
  const auto& single = dynamic_cast<const SingleRoundCodec&>(*codec);
  constexpr size_t n = 500;
  constexpr int kTrials = 4000;
  const std::vector<float> g = Normal(n, 7);
  const int64_t shape[] = {n};
  std::vector<double> sum(n, 0.0);
  for (int t = 0; t < kTrials; ++t) {
    TensorState state;
    Bytes payload;
    ASSERT_TRUE(
        single.Encode(TensorView{g, shape}, state, Context(t), &payload).ok());
    std::vector<float> x(n, 0.0f);
    ASSERT_TRUE(single.DecodeAdd(payload, 1.0f, absl::MakeSpan(x)).ok());
    for (size_t i = 0; i < n; ++i) sum[i] += x[i];
  }
  const double p = 100.0 / n;
  double z2 = 0;
  for (size_t i = 0; i < n; ++i) {
    const double sd = std::fabs(g[i]) * std::sqrt((1 - p) / p / kTrials);
    const double z = (sum[i] / kTrials - g[i]) / sd;
    EXPECT_LT(std::fabs(z), 5.5) << i;
    z2 += z * z;
  }
  EXPECT_NEAR(z2 / n, 1.0, 0.25);
}

TEST(RandomKTest, ErrorFeedbackVariantIsUnscaledAndKeepsResidualsBounded) {
  // e_{t+1} = (I - P_t)(e_t + g_t) with P_t keeping a random fraction p of
  // the coordinates: for independent N(0, 1) gradients E||e||^2 / n settles
  // at (1 - p) / p = 9 for p = 0.1. Its average over 1000 coordinates has sd
  // ~0.66 (e_i is z times the sqrt of a geometric count with mean 9 and
  // E L^2 = 171), so 14 is a 7 sd ceiling for every step.
  const auto codec = Make({{"ratio", "0.1"}, {"error_feedback", "true"}});
  EXPECT_FALSE(codec->info().unbiased);
  EXPECT_TRUE(codec->info().stateful);
  EXPECT_TRUE(codec->info().summable);
  constexpr size_t n = 1000;
  const int64_t shape[] = {n};
  std::vector<TensorState> states(1);
  std::vector<double> input_total(n, 0.0);
  std::vector<double> output_total(n, 0.0);
  double late_mean = 0;
  for (int t = 0; t < 1000; ++t) {
    const std::vector<float> g = Normal(n, 1000 + t);
    absl::StatusOr<SimulatedStep> step =
        SimulateStep(*codec, {g}, shape, states, Context(t));
    ASSERT_TRUE(step.ok()) << step.status();
    const absl::Span<float> e = *states[0].Find(kErrorFeedbackBuffer);
    double e2 = 0;
    for (size_t i = 0; i < n; ++i) {
      input_total[i] += g[i];
      output_total[i] += step->out[0][i];
      e2 += static_cast<double>(e[i]) * e[i];
    }
    ASSERT_LT(e2 / n, 14.0) << "step " << t;
    if (t >= 500) late_mean += e2 / n / 500;
  }
  // Averaged over 500 correlated steps (correlation time ~1/p = 10 steps):
  // sd ~0.66 / sqrt(50) ~ 0.1.
  EXPECT_NEAR(late_mean, 9.0, 0.8);
  // Nothing is lost: what went out plus what is kept is what came in.
  const absl::Span<float> e = *states[0].Find(kErrorFeedbackBuffer);
  for (size_t i = 0; i < n; ++i) {
    EXPECT_NEAR(output_total[i] + e[i], input_total[i], 1e-3) << i;
  }
}

TEST(RandomKTest, UnscaledSendsTheValuesThemselves) {
  const auto codec = Make({{"ratio", "0.3"}, {"scale", "false"}});
  EXPECT_FALSE(codec->info().unbiased);
  EXPECT_FALSE(codec->info().stateful);
  const std::vector<float> g = Normal(100, 9);
  const int64_t shape[] = {100};
  std::vector<TensorState> states(1);
  absl::StatusOr<SimulatedStep> step =
      SimulateStep(*codec, {g}, shape, states, Context(1));
  ASSERT_TRUE(step.ok());
  int kept = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (step->out[0][i] == 0) continue;
    ++kept;
    EXPECT_EQ(step->out[0][i], g[i]);
  }
  EXPECT_EQ(kept, 30);
}

TEST(RandomKTest, RejectsBadParameters) {
  CodecRegistry registry;
  ASSERT_TRUE(RegisterRandomK(registry).ok());
  for (const auto& params : std::vector<std::map<std::string, std::string>>{
           {{"ratio", "0"}},
           {{"ratio", "1.5"}},
           {{"ratio", "nan"}},
           {{"error_feedback", "true"}, {"scale", "true"}},
           {{"ratoi", "0.1"}}}) {
    EXPECT_EQ(registry.Create("randomk", CodecParams(params)).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
}

TEST(RandomKTest, DecodeRejectsAKLargerThanTheTensor) {
  const auto codec = Make({{"ratio", "0.5"}});
  const auto& single = dynamic_cast<const SingleRoundCodec&>(*codec);
  const std::vector<float> g = Normal(8, 3);
  const int64_t shape[] = {8};
  TensorState state;
  Bytes payload;
  ASSERT_TRUE(
      single.Encode(TensorView{g, shape}, state, Context(0), &payload).ok());
  // A payload for 8 elements decoded as one of 3: k = 4 > 3 even with the
  // header's numel patched to match.
  payload[8] = 3;
  std::vector<float> acc(3, 1.0f);
  EXPECT_EQ(single.DecodeAdd(payload, 1.0f, absl::MakeSpan(acc)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(acc, std::vector<float>(3, 1.0f));
}

TEST(RandomKTest, DecodeRejectsNonFiniteValuesAndLeavesAccUntouched) {
  const auto codec = Make({{"ratio", "0.5"}, {"scale", "false"}});
  const auto& single = dynamic_cast<const SingleRoundCodec&>(*codec);
  const std::vector<float> g = Normal(8, 3);
  const int64_t shape[] = {8};
  TensorState state;
  Bytes good;
  ASSERT_TRUE(
      single.Encode(TensorView{g, shape}, state, Context(0), &good).ok());
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    Bytes payload = good;
    // Value 2 of the k = 4 that end the payload.
    std::memcpy(&payload[payload.size() - 8], &bad, sizeof(bad));
    std::vector<float> acc(8, 1.0f);
    const absl::Status status =
        single.DecodeAdd(payload, 1.0f, absl::MakeSpan(acc));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(status.message().find("value 2 of 4"), std::string::npos)
        << status;
    EXPECT_EQ(acc, std::vector<float>(8, 1.0f));
    EXPECT_EQ(ParseRandomKPayload(payload, 8).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
}

TEST(RandomKTest, EncodeRejectsValuesThatAreNotFinite) {
  const auto codec = Make({{"ratio", "0.01"}});  // k = 1, scale 100
  const auto& single = dynamic_cast<const SingleRoundCodec&>(*codec);
  const int64_t shape[] = {100};
  TensorState state;
  Bytes payload;
  // 1e37 is finite; 1e37 * 100 is not.
  for (float value : {1e37f, NAN}) {
    const std::vector<float> g(100, value);
    EXPECT_EQ(
        single.Encode(TensorView{g, shape}, state, Context(0), &payload).code(),
        absl::StatusCode::kInvalidArgument)
        << value;
  }
}

TEST(RandomKTest, ParseRandomKPayloadGivesKTheDrawAndTheValues) {
  RandomKOptions options;
  options.ratio = 0.3;
  options.scale = false;
  const RandomKCodec codec(options);
  const std::vector<float> g = Normal(20, 8);
  const int64_t shape[] = {20};
  TensorState state;
  StepContext ctx;
  ctx.seed = 5;
  ctx.tensor_id = 2;
  ctx.step = 9;
  Bytes payload;
  ASSERT_TRUE(codec.Encode(TensorView{g, shape}, state, ctx, &payload).ok());
  const absl::StatusOr<RandomKPayload> p = ParseRandomKPayload(payload, 20);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->k, 6u);
  const std::vector<uint64_t> bitmap = DrawRandomKBitmap(20, 6, p->rng);
  EXPECT_EQ(bitmap,
            DrawRandomKBitmap(20, 6, PhiloxStream(5, 2, 9, /*round=*/0)));
  ASSERT_EQ(p->values.size(), 6u * sizeof(float));
  size_t j = 0;
  for (size_t i = 0; i < 20; ++i) {
    if ((bitmap[0] >> i & 1) == 0) continue;
    float value;
    std::memcpy(&value, p->values.data() + 4 * j++, sizeof(value));
    EXPECT_EQ(value, g[i]) << i;
  }

  // A tensor of fewer than k elements.
  const absl::Status s = ParseRandomKPayload(payload, 5).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace gradcomp::codecs
