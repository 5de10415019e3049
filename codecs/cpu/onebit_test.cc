#include "codecs/cpu/onebit.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <set>
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

// Column j of a [rows, cols] tensor drawn at scale 10^(j % 5 - 2), so that
// a per-tensor scale would be wrong for most columns.
std::vector<float> Columns(size_t rows, size_t cols, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist;
  std::vector<float> x(rows * cols);
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = dist(gen) * std::pow(10.0f, static_cast<float>((i % cols) % 5) - 2);
  }
  return x;
}

std::unique_ptr<Codec> Make() {
  CodecRegistry registry;
  EXPECT_TRUE(RegisterOneBit(registry).ok());
  auto codec = registry.Create("onebit", CodecParams());
  EXPECT_TRUE(codec.ok()) << codec.status();
  return std::move(codec).value();
}

absl::StatusOr<SimulatedStep> Step(const Codec& codec,
                                   const std::vector<std::vector<float>>& g,
                                   absl::Span<const int64_t> shape,
                                   std::vector<TensorState>& states,
                                   int64_t step = 0) {
  StepContext ctx;
  ctx.seed = 3;
  ctx.step = step;
  return SimulateStep(codec, g, shape, states, ctx);
}

// The per-column means of the non-negative and negative values, in double.
void ColumnMeans(const std::vector<float>& x, size_t cols,
                 std::vector<double>* pos, std::vector<double>* neg) {
  std::vector<double> ps(cols), ns(cols), pc(cols), nc(cols);
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i] < 0) {
      ns[i % cols] += x[i];
      nc[i % cols] += 1;
    } else {
      ps[i % cols] += x[i];
      pc[i % cols] += 1;
    }
  }
  pos->assign(cols, 0.0);
  neg->assign(cols, 0.0);
  for (size_t j = 0; j < cols; ++j) {
    if (pc[j] > 0) (*pos)[j] = ps[j] / pc[j];
    if (nc[j] > 0) (*neg)[j] = ns[j] / nc[j];
  }
}

TEST(OneBitTest, IsErrorFeedbackAroundTheQuantiser) {
  auto codec = Make();
  EXPECT_NE(dynamic_cast<const ErrorFeedback*>(codec.get()), nullptr);
  EXPECT_EQ(codec->info().id, CodecId::kOneBit);
  EXPECT_TRUE(codec->info().stateful);
  EXPECT_FALSE(codec->info().unbiased);
  EXPECT_FALSE(codec->info().majority_vote);
}

TEST(OneBitTest, EachColumnDecodesToItsTwoMeans) {
  auto codec = Make();
  // Wide (300 columns), narrow (3, 1: lanes repeat the columns) and
  // threaded (2^21 values) layouts.
  const std::vector<std::vector<int64_t>> shapes = {
      {40, 300}, {1001, 3}, {777}, {7, 5, 3}, {512, 4096}, {2'100'000}};
  for (const std::vector<int64_t>& shape : shapes) {
    const size_t rows = shape[0];
    size_t n = 1;
    for (int64_t d : shape) n *= d;
    const size_t cols = n / rows;
    const std::vector<float> g = Columns(rows, cols, 5);
    std::vector<TensorState> states(1);
    absl::StatusOr<SimulatedStep> step = Step(*codec, {g}, shape, states);
    ASSERT_TRUE(step.ok()) << step.status();
    std::vector<double> pos, neg;
    ColumnMeans(g, cols, &pos, &neg);
    std::vector<std::set<float>> seen(cols);
    for (size_t i = 0; i < n; ++i) {
      const size_t j = i % cols;
      const double want = g[i] < 0 ? neg[j] : pos[j];
      ASSERT_NEAR(step->own[0][i], want, 1e-6 * std::fabs(want))
          << "shape[0] " << rows << " element " << i;
      seen[j].insert(step->own[0][i]);
    }
    for (size_t j = 0; j < cols; ++j) ASSERT_LE(seen[j].size(), 2u) << j;
  }
}

TEST(OneBitTest, ZeroIsOnTheNonNegativeSideAndEmptySidesAreZero) {
  auto codec = Make();
  const int64_t shape[] = {3, 2};
  // Column 0: 0, 2, 4 (no negatives); column 1: -1, -3, 0.
  std::vector<TensorState> states(1);
  absl::StatusOr<SimulatedStep> step =
      Step(*codec, {{0, -1, 2, -3, 4, 0}}, shape, states);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(step->own[0], std::vector<float>({2, -2, 2, -2, 2, 0}));
  // Parameters: 2 columns; body: pos means (2, 0), neg means (0, -2).
  const Bytes& p = step->payloads[0][0];
  uint64_t columns;
  std::memcpy(&columns, p.data() + kWireHeaderBytes, 8);
  EXPECT_EQ(columns, 2u);
  float means[4];
  std::memcpy(means, p.data() + kWireHeaderBytes + 8, sizeof(means));
  EXPECT_EQ(std::vector<float>(means, means + 4),
            std::vector<float>({2, 0, 0, -2}));
}

TEST(OneBitTest, ErrorFeedbackInvariantHoldsEveryStep) {
  auto codec = Make();
  const int64_t shape[] = {64, 50};
  constexpr size_t kN = 64 * 50;
  std::vector<TensorState> states(1);
  std::vector<float> e_old(kN, 0.0f);
  for (int64_t t = 0; t < 20; ++t) {
    const std::vector<float> g = Columns(64, 50, 100 + t);
    absl::StatusOr<SimulatedStep> step = Step(*codec, {g}, shape, states, t);
    ASSERT_TRUE(step.ok()) << step.status();
    const absl::Span<float> e_new = *states[0].Find(kErrorFeedbackBuffer);
    for (size_t i = 0; i < kN; ++i) {
      // e_new = fl(p - D): exact up to half an ulp of e_new.
      const float p = g[i] + e_old[i];
      ASSERT_NEAR(p, static_cast<double>(step->own[0][i]) + e_new[i],
                  1.2e-7 * std::fabs(e_new[i]) + 1e-12)
          << "step " << t << " element " << i;
    }
    e_old.assign(e_new.begin(), e_new.end());
  }
}

TEST(OneBitTest, ErrorFeedbackKeepsTheResidualBoundedOver1000Steps) {
  auto codec = Make();
  const int64_t shape[] = {32, 16};
  constexpr size_t kN = 32 * 16;
  std::vector<TensorState> states(1);
  std::vector<double> residual_norm;
  std::vector<double> sent(kN, 0.0), given(kN, 0.0);
  for (int64_t t = 0; t < 1000; ++t) {
    // A stream with a persistent mean per element, as gradients have.
    std::vector<float> g = Columns(32, 16, 1000 + t);
    for (size_t i = 0; i < kN; ++i) g[i] += 0.01f * ((i % 7) - 3.0f);
    absl::StatusOr<SimulatedStep> step = Step(*codec, {g}, shape, states, t);
    ASSERT_TRUE(step.ok()) << step.status();
    const absl::Span<float> e = *states[0].Find(kErrorFeedbackBuffer);
    double norm = 0, gnorm = 0;
    for (size_t i = 0; i < kN; ++i) {
      norm += static_cast<double>(e[i]) * e[i];
      gnorm += static_cast<double>(g[i]) * g[i];
      sent[i] += step->own[0][i];
      given[i] += g[i];
    }
    residual_norm.push_back(std::sqrt(norm / gnorm));
  }
  // Bounded: no step's residual exceeds a few gradients, and the last 100
  // steps are no larger than the second 100 (no drift).
  double late = 0, early = 0, peak = 0;
  for (int t = 100; t < 200; ++t) early += residual_norm[t];
  for (int t = 900; t < 1000; ++t) late += residual_norm[t];
  for (double r : residual_norm) peak = std::max(peak, r);
  EXPECT_LT(peak, 5.0);
  EXPECT_LT(late, 1.25 * early);
  // What was sent sums to what was given, less the final residual.
  const absl::Span<float> e = *states[0].Find(kErrorFeedbackBuffer);
  for (size_t i = 0; i < kN; ++i) {
    ASSERT_NEAR(sent[i] + e[i], given[i], 1e-3 * (1 + std::fabs(given[i])))
        << i;
  }
}

TEST(OneBitTest, DecoderRejectsBadColumnsAndMeans) {
  auto codec = Make();
  const auto& single = dynamic_cast<const SingleRoundCodec&>(*codec);
  const int64_t shape[] = {6, 4};
  std::vector<TensorState> states(1);
  absl::StatusOr<SimulatedStep> step =
      Step(*codec, {Columns(6, 4, 9)}, shape, states);
  ASSERT_TRUE(step.ok()) << step.status();
  const Bytes& good = step->payloads[0][0];
  auto expect_bad = [&](const Bytes& bad, const char* what) {
    std::vector<float> acc(24, 7.0f);
    EXPECT_EQ(single.DecodeAdd(bad, 1.0f, absl::MakeSpan(acc)).code(),
              absl::StatusCode::kInvalidArgument)
        << what;
    EXPECT_EQ(acc, std::vector<float>(24, 7.0f)) << what;
  };
  // Column counts that do not divide 24, or exceed it.
  for (uint64_t columns :
       {uint64_t{0}, uint64_t{5}, uint64_t{48}, uint64_t{1} << 62}) {
    Bytes bad = good;
    std::memcpy(bad.data() + kWireHeaderBytes, &columns, 8);
    expect_bad(bad, "column count");
  }
  // A positive-side mean below zero, a negative-side mean above, NaN.
  for (int slot : {0, 4}) {
    for (float v : {slot == 0 ? -1.0f : 1.0f, std::nanf("")}) {
      Bytes bad = good;
      std::memcpy(bad.data() + kWireHeaderBytes + 8 + 4 * slot, &v, 4);
      expect_bad(bad, "mean");
    }
  }
}

TEST(OneBitTest, RejectsAShapeThatDoesNotDivideTheValues) {
  auto codec = Make();
  const int64_t shape[] = {4};
  std::vector<TensorState> states(1);
  EXPECT_EQ(Step(*codec, {{1, 2, 3}}, shape, states).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<float> g = Columns(4, 3, 1);
  g[5] = std::nanf("");
  const int64_t shape2[] = {4, 3};
  EXPECT_EQ(Step(*codec, {g}, shape2, states).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(OneBitTest, RejectsParameters) {
  CodecRegistry registry;
  ASSERT_TRUE(RegisterOneBit(registry).ok());
  EXPECT_EQ(registry.Create("onebit", CodecParams({{"columns", "4"}}))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(OneBitTest, ParseOneBitPayloadGivesTheColumnsMeansAndSigns) {
  const OneBitCodec codec;
  // [3, 2]: column 0 is {1, 3, 5}, column 1 is {-2, -4, 6}.
  const std::vector<float> g = {1, -2, 3, -4, 5, 6};
  const int64_t shape[] = {3, 2};
  TensorState state;
  Bytes payload;
  ASSERT_TRUE(
      codec.Encode(TensorView{g, shape}, state, StepContext{}, &payload).ok());
  const absl::StatusOr<OneBitPayload> p = ParseOneBitPayload(payload, 6);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->columns, 2u);
  ASSERT_EQ(p->means.size(), 16u);
  float means[4];
  std::memcpy(means, p->means.data(), sizeof(means));
  EXPECT_EQ(means[0], 3.0f);
  EXPECT_EQ(means[1], 6.0f);
  EXPECT_EQ(means[2], 0.0f);  // column 0 has no negative values
  EXPECT_EQ(means[3], -3.0f);
  // The header, the 8-byte column count, the means, then the signs.
  EXPECT_EQ(p->signs.data(), payload.data() + kWireHeaderBytes + 8 + 16);
  EXPECT_EQ(p->signs.size(), payload.size() - kWireHeaderBytes - 8 - 16);

  EXPECT_EQ(ParseOneBitPayload(payload, 8).status().code(),
            absl::StatusCode::kInvalidArgument);
  Bytes bad = payload;
  const float minus_one = -1.0f;
  std::memcpy(bad.data() + kWireHeaderBytes + 8, &minus_one, 4);
  const absl::Status s = ParseOneBitPayload(bad, 6).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("column 0 has means -1 and 0"),
            absl::string_view::npos)
      << s;
}

}  // namespace
}  // namespace gradcomp::codecs
