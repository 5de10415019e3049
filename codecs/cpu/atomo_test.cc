#include "codecs/cpu/atomo.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "Eigen/Dense"
#include "codecs/state.h"
#include "codecs/wire.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradcomp::codecs {
namespace {

std::vector<float> Normal(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist;
  std::vector<float> x(n);
  for (float& v : x) v = dist(gen);
  return x;
}

std::unique_ptr<AtomoCodec> Make(const std::string& atoms,
                                 const std::string& budget) {
  auto codec =
      AtomoCodec::Create(CodecParams({{"atoms", atoms}, {"budget", budget}}));
  EXPECT_TRUE(codec.ok()) << codec.status();
  return std::move(codec).value();
}

std::vector<float> RoundTrip(const AtomoCodec& codec,
                             const std::vector<float>& g,
                             std::vector<int64_t> shape, int64_t step,
                             size_t* payload_bytes = nullptr) {
  TensorState state;
  StepContext ctx;
  ctx.seed = 3;
  ctx.tensor_id = 4;
  ctx.step = step;
  Bytes payload;
  const absl::Status encoded =
      codec.Encode(TensorView{g, shape}, state, ctx, &payload);
  EXPECT_TRUE(encoded.ok()) << encoded;
  if (payload_bytes != nullptr) *payload_bytes = payload.size();
  std::vector<float> out(g.size(), 0.0f);
  const absl::Status decoded =
      codec.DecodeAdd(payload, 1.0f, absl::MakeSpan(out));
  EXPECT_TRUE(decoded.ok()) << decoded;
  return out;
}

double Sum(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s;
}

std::vector<double> Probabilities(const std::vector<float>& lambda, double s) {
  const AtomoProbabilities probs = ComputeAtomoProbabilities(lambda, s);
  std::vector<double> p;
  for (float l : lambda) p.push_back(probs.p(l));
  return p;
}

TEST(AtomoProbabilitiesTest, WorkedExamples) {
  // |lambda| = 10, 1, 1 with s = 2: 10 * 2 > 12, so p = 1; then 1 * 1 <= 2
  // and the remaining 1 is shared: 0.5 each.
  EXPECT_EQ(Probabilities({1, -10, 1}, 2), (std::vector<double>{0.5, 1, 0.5}));
  // No atom dominates: p proportional to |lambda|.
  EXPECT_EQ(Probabilities({1, 2, 3, 2}, 2),
            (std::vector<double>{0.25, 0.5, 0.75, 0.5}));
  // s at least the nonzero count: those are kept, zeros never.
  EXPECT_EQ(Probabilities({0, 5, 0, -1}, 2), (std::vector<double>{0, 1, 0, 1}));
  EXPECT_EQ(Probabilities({0, 5, 0, -1}, 7), (std::vector<double>{0, 1, 0, 1}));
  EXPECT_EQ(Probabilities({3, 1}, 5), (std::vector<double>{1, 1}));
  EXPECT_EQ(Probabilities({0, 0}, 1), (std::vector<double>{0, 0}));
}

TEST(AtomoProbabilitiesTest, SumToTheBudgetInUnitIntervalAndBeatUniform) {
  std::mt19937 gen(5);
  std::lognormal_distribution<float> heavy(0.0f, 2.0f);
  for (int trial = 0; trial < 200; ++trial) {
    const size_t n = 1 + gen() % 300;
    std::vector<float> lambda(n);
    size_t nonzero = 0;
    for (float& l : lambda) {
      l = (gen() % 5 == 0) ? 0.0f : heavy(gen) * ((gen() & 1) ? 1 : -1);
      nonzero += l != 0;
    }
    const double s = 0.5 + (gen() % 1000) / 1000.0 * 1.2 * n;
    const std::vector<double> p = Probabilities(lambda, s);
    const double expected = std::min(s, static_cast<double>(nonzero));
    ASSERT_NEAR(Sum(p), expected, 1e-9 * n) << trial;
    double variance = 0, uniform_variance = 0;
    const double q = std::min(1.0, s / n);
    for (size_t i = 0; i < n; ++i) {
      if (lambda[i] == 0) {
        ASSERT_EQ(p[i], 0.0);
        continue;
      }
      ASSERT_GT(p[i], 0.0) << trial;
      ASSERT_LE(p[i], 1.0) << trial;
      const double l2 = static_cast<double>(lambda[i]) * lambda[i];
      variance += l2 * (1 - p[i]) / p[i];
      uniform_variance += l2 * (1 - q) / q;
    }
    ASSERT_LE(variance, uniform_variance * (1 + 1e-12) + 1e-12) << trial;
  }
}

TEST(AtomoProbabilitiesTest, MinimiseVarianceForTheirSum) {
  // Moving probability mass between two atoms (keeping the sum) never
  // lowers sum lambda^2 (1 - p) / p: p is a constrained minimum.
  const std::vector<float> lambda = Normal(50, 6);
  const std::vector<double> p = Probabilities(lambda, 7);
  auto variance = [&](const std::vector<double>& q) {
    double v = 0;
    for (size_t i = 0; i < q.size(); ++i) {
      v += static_cast<double>(lambda[i]) * lambda[i] * (1 - q[i]) / q[i];
    }
    return v;
  };
  const double best = variance(p);
  for (size_t i = 0; i < lambda.size(); ++i) {
    for (size_t j = 0; j < lambda.size(); ++j) {
      const double d = 0.01 * std::min(p[i], 1 - p[j]);
      if (i == j || d <= 0) continue;
      std::vector<double> q = p;
      q[i] -= d;
      q[j] += d;
      ASSERT_GE(variance(q), best) << i << " " << j;
    }
  }
}

TEST(AtomoCodecTest, RejectsBadParameters) {
  EXPECT_FALSE(AtomoCodec::Create(CodecParams({{"atoms", "rows"}})).ok());
  EXPECT_FALSE(AtomoCodec::Create(CodecParams({{"budget", "0"}})).ok());
  EXPECT_FALSE(
      AtomoCodec::Create(CodecParams({{"atoms", "entry"}, {"budget", "2"}}))
          .ok());
  EXPECT_FALSE(AtomoCodec::Create(CodecParams({{"bugdet", "2"}})).ok());
  EXPECT_EQ(AtomoCodec::Create(CodecParams({{"atoms", "entry"}}))
                .value()
                ->options()
                .budget,
            0.01);
}

TEST(AtomoCodecTest, BudgetCoveringEveryAtomIsExact) {
  // Entry atoms with budget 1 send g / 1: bit-exact.
  const std::vector<float> g = Normal(500, 7);
  EXPECT_EQ(RoundTrip(*Make("entry", "1"), g, {500}, 0), g);
  // A rank-3 matrix with s = 3: its three atoms are kept, the rest (fp32
  // noise in the SVD) have weight ~1e-7 and get p = 0.
  constexpr int64_t kRows = 20, kCols = 30;
  std::vector<float> m(kRows * kCols, 0.0f);
  const std::vector<float> a = Normal(kRows * 3, 8), b = Normal(kCols * 3, 9);
  for (int64_t i = 0; i < kRows; ++i) {
    for (int64_t j = 0; j < kCols; ++j) {
      for (int k = 0; k < 3; ++k)
        m[i * kCols + j] += a[i * 3 + k] * b[j * 3 + k];
    }
  }
  for (const char* budget : {"3", "20"}) {
    const std::vector<float> out =
        RoundTrip(*Make("spectral", budget), m, {kRows, kCols}, 0);
    double err = 0, norm = 0;
    for (size_t i = 0; i < m.size(); ++i) {
      err += (out[i] - m[i]) * (out[i] - m[i]);
      norm += m[i] * m[i];
    }
    EXPECT_LT(std::sqrt(err / norm), 1e-5) << budget;
  }
}

TEST(AtomoCodecTest, PayloadHoldsTheKeptAtoms) {
  // s = 20 of 20 spectral atoms: all kept, 20 * (20 + 30) floats.
  size_t bytes = 0;
  RoundTrip(*Make("spectral", "20"), Normal(600, 10), {20, 30}, 0, &bytes);
  EXPECT_EQ(bytes, kWireHeaderBytes + 16 + 4 * 20 * 50);
}

// Monte Carlo over steps (each step draws anew): the mean decode converges
// to g with the per-element variance Algorithm 1's p implies. Each z-score
// (mean - g) / sqrt(var / T) is near N(0, 1): their mean square must be
// near 1 and none far out.
void ExpectUnbiased(const AtomoCodec& codec, const std::vector<float>& g,
                    std::vector<int64_t> shape,
                    const std::vector<double>& variance, int trials) {
  std::vector<double> sum(g.size(), 0.0);
  for (int t = 0; t < trials; ++t) {
    const std::vector<float> out = RoundTrip(codec, g, shape, t);
    for (size_t i = 0; i < g.size(); ++i) sum[i] += out[i];
  }
  double z2 = 0;
  int count = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const double mean = sum[i] / trials;
    if (variance[i] < 1e-12) {
      EXPECT_NEAR(mean, g[i], 1e-4 * (1 + std::fabs(g[i]))) << i;
      continue;
    }
    const double z = (mean - g[i]) / std::sqrt(variance[i] / trials);
    EXPECT_LT(std::fabs(z), 5.5) << i;
    z2 += z * z;
    ++count;
  }
  ASSERT_GT(count, 0);
  // The mean of `count` squared N(0, 1) has sd sqrt(2 / count); the
  // spectral elements are correlated, so allow a wide band.
  EXPECT_NEAR(z2 / count, 1.0, 0.3);
}

TEST(AtomoCodecTest, EntryAtomsAreUnbiased) {
  std::vector<float> g = Normal(400, 11);
  for (size_t i = 0; i < g.size(); i += 7) g[i] *= 20;  // some sure atoms
  const auto codec = Make("entry", "0.1");
  const AtomoProbabilities probs = ComputeAtomoProbabilities(g, 40);
  std::vector<double> variance;
  for (float x : g) {
    const double p = probs.p(x);
    variance.push_back(static_cast<double>(x) * x * (1 - p) / p);
  }
  ExpectUnbiased(*codec, g, {400}, variance, 4000);
}

TEST(AtomoCodecTest, SpectralAtomsAreUnbiased) {
  constexpr int64_t kRows = 8, kCols = 12;
  const std::vector<float> g = Normal(kRows * kCols, 12);
  const auto codec = Make("spectral", "3");
  // The per-element variance from a double SVD: sum over atoms of
  // (1 - p_k) / p_k (sigma_k u_ik v_jk)^2.
  Eigen::MatrixXd m(kRows, kCols);
  for (int64_t i = 0; i < kRows; ++i) {
    for (int64_t j = 0; j < kCols; ++j) m(i, j) = g[i * kCols + j];
  }
  const Eigen::JacobiSVD<Eigen::MatrixXd> svd(
      m, Eigen::ComputeThinU | Eigen::ComputeThinV);
  std::vector<float> sigma;
  for (int k = 0; k < svd.singularValues().size(); ++k) {
    sigma.push_back(static_cast<float>(svd.singularValues()[k]));
  }
  const AtomoProbabilities probs = ComputeAtomoProbabilities(sigma, 3);
  std::vector<double> variance(g.size(), 0.0);
  for (size_t k = 0; k < sigma.size(); ++k) {
    const double p = probs.p(sigma[k]);
    for (int64_t i = 0; i < kRows; ++i) {
      for (int64_t j = 0; j < kCols; ++j) {
        const double a = sigma[k] * svd.matrixU()(i, k) * svd.matrixV()(j, k);
        variance[i * kCols + j] += a * a * (1 - p) / p;
      }
    }
  }
  ExpectUnbiased(*codec, g, {kRows, kCols}, variance, 4000);
}

TEST(AtomoCodecTest, RejectsNonFiniteGradients) {
  std::vector<float> g = Normal(30, 13);
  g[4] = std::nanf("");
  TensorState state;
  Bytes payload;
  const int64_t shape[] = {5, 6};
  for (const char* atoms : {"spectral", "entry"}) {
    EXPECT_EQ(Make(atoms, "0.5")
                  ->Encode(TensorView{g, shape}, state, StepContext(), &payload)
                  .code(),
              absl::StatusCode::kInvalidArgument);
  }
}

// Finite gradients whose atoms, divided by their probability, pass
// FLT_MAX: refused where they are encoded, not sent for every rank's
// decoder to refuse.
TEST(AtomoCodecTest, RefusesAtomsThatLeaveFloatRangeWhenScaled) {
  TensorState state;
  Bytes payload;
  // 1000 entries of 1e37 at budget 0.01: p = 0.01, each kept one 1e39.
  const std::vector<float> entries(1000, 1e37f);
  const int64_t row[] = {1000};
  // Singular value 4e38 at budget 1.
  const std::vector<float> matrix(4, 2e38f);
  const int64_t square[] = {2, 2};
  for (const auto& [atoms, budget, g, shape] :
       {std::tuple{"entry", "0.01", &entries, absl::MakeConstSpan(row)},
        std::tuple{"spectral", "1", &matrix, absl::MakeConstSpan(square)}}) {
    const absl::Status got =
        Make(atoms, budget)
            ->Encode(TensorView{*g, shape}, state, StepContext(), &payload);
    EXPECT_EQ(got.code(), absl::StatusCode::kInvalidArgument) << atoms;
    EXPECT_THAT(std::string(got.message()),
                ::testing::HasSubstr("divided by its probability leaves "
                                     "float range"))
        << atoms;
  }
}

// Every atom finite and kept (p = 1), but row 0's u sigma values add up to
// about 4.03e38: every decoder refuses such a payload, though the true row
// (2.12e38, -1.91e38) is finite. Refused where it is encoded.
TEST(AtomoCodecTest, RefusesAtomsWhoseRowSumsTheDecoderRefuses) {
  const std::vector<float> g = {2.12e38f, -1.91e38f, 2.12e38f, 1.91e38f};
  const int64_t shape[] = {2, 2};
  TensorState state;
  Bytes payload;
  const absl::Status got =
      Make("spectral", "2")
          ->Encode(TensorView{g, shape}, state, StepContext(), &payload);
  EXPECT_EQ(got.code(), absl::StatusCode::kInvalidArgument) << got;
  EXPECT_THAT(std::string(got.message()),
              ::testing::HasSubstr("u values of one row, added up,"));
}

// A spectral payload of a rows x cols tensor holding `atoms` (each u sigma /
// p, then v).
Bytes SpectralPayload(uint64_t rows, uint64_t cols,
                      const std::vector<std::vector<float>>& atoms) {
  char params[16] = {1};
  const uint32_t count = static_cast<uint32_t>(atoms.size());
  std::memcpy(params + 4, &count, sizeof(count));
  std::memcpy(params + 8, &rows, sizeof(rows));
  std::string body;
  for (const std::vector<float>& atom : atoms) {
    body.append(reinterpret_cast<const char*>(atom.data()), 4 * atom.size());
  }
  WireHeader header;
  header.codec = CodecId::kAtomo;
  header.numel = rows * cols;
  Bytes out;
  WritePayload(header, absl::string_view(params, sizeof(params)), body, &out);
  return out;
}

TEST(AtomoCodecTest, SpectralDecodeRejectsVectorsThatAreNotUnitSized) {
  const auto codec = Make("spectral", "2");
  // u = v = 1e30 is finite, and decodes to 1e60: Inf.
  const Bytes huge =
      SpectralPayload(2, 3, {{1e30f, 1e30f, 1e30f, 1e30f, 1e30f}});
  // The magnitude belongs in u sigma / p; v's entries are at most 1.
  const Bytes past_one =
      SpectralPayload(2, 3, {{1, 1, 0.6f, 0.8f, 0}, {1, 1, 0, 0, 1.01f}});
  for (const Bytes& payload : {huge, past_one}) {
    std::vector<float> acc(6, 1.0f);
    const absl::Status status =
        codec->DecodeAdd(payload, 1.0f, absl::MakeSpan(acc));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_EQ(acc, std::vector<float>(6, 1.0f));
  }
  // Large u sigma / p with a unit v is a valid atom.
  std::vector<float> acc(6, 0.0f);
  ASSERT_TRUE(codec
                  ->DecodeAdd(SpectralPayload(2, 3, {{1e30f, -2, 0, -1, 0}}),
                              1.0f, absl::MakeSpan(acc))
                  .ok());
  EXPECT_EQ(acc, (std::vector<float>{0, -1e30f, 0, 0, 2, 0}));
}

// Each atom alone decodes to finite values, but row 0's two u values add
// up past FLT_MAX.
TEST(AtomoCodecTest, SpectralDecodeRejectsAtomsWhoseSumOverflows) {
  const auto codec = Make("spectral", "2");
  const Bytes payload =
      SpectralPayload(2, 3, {{3e38f, 1, 1, 0, 0}, {3e38f, 1, 1, 0, 0}});
  std::vector<float> acc(6, 1.0f);
  const absl::Status status =
      codec->DecodeAdd(payload, 1.0f, absl::MakeSpan(acc));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(std::string(status.message()).find("row 0"), std::string::npos)
      << status;
  EXPECT_EQ(acc, std::vector<float>(6, 1.0f));
  // Half as large each, they fit.
  ASSERT_TRUE(
      codec
          ->DecodeAdd(SpectralPayload(
                          2, 3, {{1.5e38f, 1, 1, 0, 0}, {1.5e38f, 1, 1, 0, 0}}),
                      1.0f, absl::MakeSpan(acc))
          .ok());
  EXPECT_TRUE(std::isfinite(acc[0])) << acc[0];
}

TEST(AtomoCodecTest, EncodedSpectralPayloadsAlwaysDecode) {
  // Shapes and inputs whose singular vectors have an entry at or near 1
  // (one-hot, a spike, a dominant column), where the SVD's rounding could
  // take it past 1.
  const auto codec = Make("spectral", "1000");
  const std::vector<std::vector<int64_t>> shapes = {
      {1, 1}, {1, 9}, {9, 1}, {3, 50}, {50, 3}, {40, 400}, {120, 120}};
  for (const std::vector<int64_t>& shape : shapes) {
    const size_t n = static_cast<size_t>(shape[0] * shape[1]);
    std::vector<float> normal = Normal(n, 21);
    std::vector<float> one_hot(n, 0.0f);
    one_hot[n / 3] = -3e20f;
    std::vector<float> spike = normal;
    spike[n / 2] = 1e6f;
    std::vector<float> column = normal;
    for (size_t i = 0; i < n; i += static_cast<size_t>(shape[1])) {
      column[i] = 1e4f * normal[i];
    }
    for (const std::vector<float>& g : {normal, one_hot, spike, column}) {
      RoundTrip(*codec, g, shape, 0);  // expects the decode to succeed
    }
  }
}

}  // namespace
}  // namespace gradcomp::codecs
