#include "codecs/cpu/threshold.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "codecs/cpu/sparse_payload.h"
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

std::vector<float> Normal(size_t n, uint32_t seed, float sd = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, sd);
  std::vector<float> x(n);
  for (float& v : x) v = dist(gen);
  return x;
}

ThresholdSparsifier Sparsifier(std::map<std::string, std::string> params) {
  const absl::StatusOr<ThresholdOptions> options =
      ThresholdSparsifier::ParseOptions(CodecParams(std::move(params)));
  EXPECT_TRUE(options.ok()) << options.status();
  return ThresholdSparsifier(*options);
}

// Encodes and decodes with the sparsifier alone; returns the decode and the
// number of pairs sent.
std::vector<float> RoundTrip(const ThresholdSparsifier& codec,
                             const std::vector<float>& v, uint32_t* count) {
  const int64_t shape[] = {static_cast<int64_t>(v.size())};
  TensorState state;
  Bytes payload;
  EXPECT_TRUE(
      codec.Encode(TensorView{v, shape}, state, StepContext(), &payload).ok());
  std::memcpy(count, payload.data() + kWireHeaderBytes + 4, sizeof(*count));
  std::vector<float> out(v.size(), 0.0f);
  const absl::Status status =
      codec.DecodeAdd(payload, 1.0f, absl::MakeSpan(out));
  EXPECT_TRUE(status.ok()) << status;
  return out;
}

TEST(ThresholdTest, SendsExactlyTheEntriesAtOrAboveTau) {
  // Threaded path (3M values): every |v| >= 2 goes exactly, nothing else.
  const ThresholdSparsifier codec = Sparsifier({{"tau", "2"}});
  std::vector<float> v = Normal(3'000'017, 1);
  v[5] = 2.0f;
  v[6] = -2.0f;
  v[7] = std::nextafter(2.0f, 0.0f);
  uint32_t count = 0;
  const std::vector<float> out = RoundTrip(codec, v, &count);
  uint32_t expected = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    const bool sent = std::fabs(v[i]) >= 2.0f;
    expected += sent;
    ASSERT_EQ(out[i], sent ? v[i] : 0.0f) << i;
  }
  EXPECT_EQ(count, expected);
  // P(|z| >= 2) = 4.55 %: 136.6k expected, sd 360.
  EXPECT_NEAR(count, 0.0455 * v.size(), 2000);
}

TEST(ThresholdTest, RelativeTauFollowsTheRmsAndAlwaysSendsTheLargest) {
  const ThresholdSparsifier codec = Sparsifier({});  // tau_rms 2.5
  std::vector<float> v = Normal(10000, 2, 1e-3f);
  double sum = 0;
  for (float x : v) sum += static_cast<double>(x) * x;
  EXPECT_NEAR(codec.TauFor(v), 2.5 * std::sqrt(sum / v.size()), 1e-9);
  uint32_t count = 0;
  RoundTrip(codec, v, &count);
  // P(|z| >= 2.5) = 1.24 %: 124 expected, sd 11.
  EXPECT_NEAR(count, 124, 55);
  // One element: RMS * 2.5 > |v|, clamped to |v| so that it is sent.
  EXPECT_EQ(RoundTrip(codec, {-0.25f}, &count), std::vector<float>{-0.25f});
  EXPECT_EQ(count, 1u);
  // Zeros are never sent, with either threshold.
  RoundTrip(codec, std::vector<float>(50, 0.0f), &count);
  EXPECT_EQ(count, 0u);
}

TEST(ThresholdTest, AccumulationKeepsEveryResidualBelowTauAndLosesNothing) {
  // Whatever reaches tau is sent, so after every step |e_i| < tau; and what
  // went out plus what is kept is what came in.
  CodecRegistry registry;
  ASSERT_TRUE(RegisterThreshold(registry).ok());
  auto codec = registry.Create("threshold", CodecParams({{"tau", "1"}}));
  ASSERT_TRUE(codec.ok()) << codec.status();
  EXPECT_TRUE((*codec)->info().stateful);
  constexpr size_t n = 1000;
  const int64_t shape[] = {n};
  std::vector<TensorState> states(1);
  std::vector<double> input_total(n, 0.0);
  std::vector<double> output_total(n, 0.0);
  size_t sent = 0;
  StepContext ctx;
  for (int t = 0; t < 1000; ++t) {
    // A drift of 0.05 per step plus noise: small entries must add up.
    std::vector<float> g = Normal(n, 100 + t, 0.2f);
    for (float& x : g) x += 0.05f;
    ctx.step = t;
    absl::StatusOr<SimulatedStep> step =
        SimulateStep(**codec, {g}, shape, states, ctx);
    ASSERT_TRUE(step.ok()) << step.status();
    const absl::Span<float> e = *states[0].Find(kErrorFeedbackBuffer);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_LT(std::fabs(e[i]), 1.0f) << "step " << t << " index " << i;
      input_total[i] += g[i];
      output_total[i] += step->out[0][i];
      sent += step->out[0][i] != 0;
    }
  }
  const absl::Span<float> e = *states[0].Find(kErrorFeedbackBuffer);
  for (size_t i = 0; i < n; ++i) {
    EXPECT_NEAR(output_total[i] + e[i], input_total[i], 1e-3) << i;
  }
  // The drift alone crosses tau every ~20 steps: at least 40 sends each.
  EXPECT_GT(sent, 40 * n);
}

TEST(ThresholdTest, EncodeRejectsNonFiniteValues) {
  const int64_t shape[] = {8};
  for (const auto& params :
       std::vector<std::map<std::string, std::string>>{{{"tau", "1"}}, {}}) {
    const ThresholdSparsifier codec = Sparsifier(params);
    for (float bad : {NAN, INFINITY}) {
      std::vector<float> v(8, 3.0f);
      v[2] = bad;
      TensorState state;
      Bytes payload;
      EXPECT_EQ(
          codec.Encode(TensorView{v, shape}, state, StepContext(), &payload)
              .code(),
          absl::StatusCode::kInvalidArgument);
    }
  }
}

TEST(ThresholdTest, DecodeRejectsACountBeyondTheTensor) {
  const ThresholdSparsifier codec = Sparsifier({{"tau", "0.5"}});
  const std::vector<float> v = {1, 2, 3, 0};
  const int64_t shape[] = {4};
  TensorState state;
  Bytes payload;
  ASSERT_TRUE(
      codec.Encode(TensorView{v, shape}, state, StepContext(), &payload).ok());
  const uint32_t five = 5;
  std::memcpy(&payload[kWireHeaderBytes + 4], &five, 4);
  std::vector<float> acc(4, 1.0f);
  EXPECT_EQ(codec.DecodeAdd(payload, 1.0f, absl::MakeSpan(acc)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(acc, std::vector<float>(4, 1.0f));
}

TEST(ThresholdTest, DecodeRejectsNonFiniteValuesAndLeavesAccUntouched) {
  CodecRegistry registry;
  ASSERT_TRUE(RegisterThreshold(registry).ok());
  absl::StatusOr<std::unique_ptr<Codec>> registered =
      registry.Create("threshold", CodecParams({{"tau", "0.5"}}));
  ASSERT_TRUE(registered.ok()) << registered.status();
  const auto& codec = dynamic_cast<const SingleRoundCodec&>(**registered);
  const std::vector<uint32_t> indices = {0, 3};
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    Bytes payload;
    WriteSparsePayload(CodecId::kThreshold, 4, indices, {bad, 1.0f}, &payload);
    std::vector<float> acc(4, 1.0f);
    const absl::Status status =
        codec.DecodeAdd(payload, 1.0f, absl::MakeSpan(acc));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(status.message().find("value 0 of 2 (at index 0)"),
              std::string::npos)
        << status;
    EXPECT_EQ(acc, std::vector<float>(4, 1.0f));
  }
}

TEST(ThresholdTest, RejectsBadParameters) {
  for (const auto& params : std::vector<std::map<std::string, std::string>>{
           {{"tau", "0"}},
           {{"tau", "-1"}},
           {{"tau_rms", "nan"}},
           {{"tau", "1"}, {"tau_rms", "2"}},
           {{"ratio", "0.1"}}}) {
    EXPECT_EQ(
        ThresholdSparsifier::ParseOptions(CodecParams(params)).status().code(),
        absl::StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace gradcomp::codecs
