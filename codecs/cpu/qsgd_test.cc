#include "codecs/cpu/qsgd.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "codecs/registry.h"
#include "codecs/state.h"
#include "codecs/testing/gather_checks.h"
#include "codecs/wire.h"
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

std::unique_ptr<QsgdCodec> Make(int bits, int bucket) {
  auto codec = QsgdCodec::Create(CodecParams(
      {{"bits", std::to_string(bits)}, {"bucket", std::to_string(bucket)}}));
  EXPECT_TRUE(codec.ok()) << codec.status();
  return std::move(codec).value();
}

Bytes Encode(const QsgdCodec& codec, const std::vector<float>& g, int64_t step,
             int rank = 0) {
  const int64_t shape[] = {static_cast<int64_t>(g.size())};
  TensorState state;
  StepContext ctx;
  ctx.seed = 17;
  ctx.tensor_id = 3;
  ctx.step = step;
  ctx.rank = rank;
  Bytes payload;
  const absl::Status status =
      codec.Encode(TensorView{g, shape}, state, ctx, &payload);
  EXPECT_TRUE(status.ok()) << status;
  return payload;
}

std::vector<float> Decode(const QsgdCodec& codec, const Bytes& payload,
                          size_t n) {
  std::vector<float> out(n, 0.0f);
  const absl::Status status =
      codec.DecodeAdd(payload, 1.0f, absl::MakeSpan(out));
  EXPECT_TRUE(status.ok()) << status;
  return out;
}

// Per-bucket L2 norms of x, in double.
std::vector<double> Norms(const std::vector<float>& x, size_t bucket) {
  std::vector<double> norms((x.size() + bucket - 1) / bucket, 0.0);
  for (size_t i = 0; i < x.size(); ++i) {
    norms[i / bucket] += static_cast<double>(x[i]) * x[i];
  }
  for (double& n : norms) n = std::sqrt(n);
  return norms;
}

TEST(QsgdCodecTest, LayoutAndLevelsFollowBits) {
  EXPECT_EQ((QsgdOptions{512, 2}.levels()), 1);
  EXPECT_EQ((QsgdOptions{512, 4}.levels()), 7);
  EXPECT_EQ((QsgdOptions{512, 8}.levels()), 127);
  const std::vector<float> g = Normal(1001, 1);
  for (int bits = 2; bits <= 8; ++bits) {
    const Bytes p = Encode(*Make(bits, 100), g, 0);
    // 11 norms, ceil(1001 * bits / 8) code bytes.
    EXPECT_EQ(p.size(), kWireHeaderBytes + 8 + 11 * 4 + (1001 * bits + 7) / 8)
        << bits;
  }
}

TEST(QsgdCodecTest, ParseNamesTheBucketBitsAndBody) {
  const std::vector<float> g = Normal(1001, 1);
  const Bytes p = Encode(*Make(5, 100), g, 0);
  const absl::StatusOr<QsgdPayload> parsed = ParseQsgdPayload(p, g.size());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->bucket, 100u);
  EXPECT_EQ(parsed->bits, 5);
  EXPECT_EQ(parsed->buckets, 11u);
  EXPECT_EQ(parsed->code_bytes, (1001u * 5 + 7) / 8);
  EXPECT_EQ(parsed->body, absl::string_view(p).substr(kWireHeaderBytes + 8));
  EXPECT_EQ(ParseQsgdPayload(p, g.size() + 1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(QsgdCodecTest, EveryValueLandsOnANeighbouringLevel) {
  // |Q_i - v_i| < ||v|| / s for every i, on a tensor large enough for the
  // threaded path and with a bucket that does not divide it.
  for (int bits : {2, 3, 4, 8}) {
    const auto codec = Make(bits, 500);
    const std::vector<float> g = Normal(3'000'017, bits);
    const std::vector<float> q = Decode(*codec, Encode(*codec, g, 0), g.size());
    const std::vector<double> norms = Norms(g, 500);
    const double s = codec->options().levels();
    for (size_t i = 0; i < g.size(); ++i) {
      ASSERT_LE(std::fabs(q[i] - g[i]), norms[i / 500] / s * (1 + 1e-5))
          << bits << " " << i;
      if (q[i] != 0) {
        ASSERT_EQ(std::signbit(q[i]), std::signbit(g[i])) << i;
      }
    }
  }
}

TEST(QsgdCodecTest, ZeroAndSingleSpikeAreExact) {
  const auto codec = Make(4, 8);
  std::vector<float> g(16, 0.0f);
  g[3] = -2.5f;
  EXPECT_EQ(Decode(*codec, Encode(*codec, g, 0), 16), g);
  const std::vector<float> zeros(16, 0.0f);
  EXPECT_EQ(Decode(*codec, Encode(*codec, zeros, 0), 16), zeros);
}

TEST(QsgdCodecTest, DeterministicPerSeedAndIndependentPerRankAndStep) {
  const auto codec = Make(4, 512);
  const std::vector<float> g = Normal(4096, 2);
  EXPECT_EQ(Encode(*codec, g, 1), Encode(*codec, g, 1));
  EXPECT_NE(Encode(*codec, g, 1), Encode(*codec, g, 2));
  EXPECT_NE(Encode(*codec, g, 1, /*rank=*/0), Encode(*codec, g, 1, 1));
}

TEST(QsgdCodecTest, UnbiasedWithTheVarianceOfTheRoundingOverSeeds) {
  // Q_i = (||v|| / s) * sign * (l + Bernoulli(p)), so E[Q_i] = v_i and
  // Var[Q_i] = (||v|| / s)^2 p (1 - p). Over T encodes the mean of Q_i has
  // standard deviation sqrt(Var / T); with the exact variance each z-score
  // must be small and their mean square close to 1.
  const size_t n = 1024;
  const size_t bucket = 256;
  const int trials = 4000;
  const auto codec = Make(3, bucket);
  const double s = codec->options().levels();
  std::vector<float> g = Normal(n, 3);
  for (size_t i = 0; i < n; ++i) g[i] *= static_cast<float>(1 + i / bucket);
  const std::vector<double> norms = Norms(g, bucket);

  std::vector<double> sum(n, 0.0);
  std::vector<double> squared_error(n / bucket, 0.0);
  for (int t = 0; t < trials; ++t) {
    const std::vector<float> q = Decode(*codec, Encode(*codec, g, t), n);
    for (size_t i = 0; i < n; ++i) {
      sum[i] += q[i];
      squared_error[i / bucket] += (q[i] - g[i]) * (q[i] - g[i]);
    }
  }
  double z2_sum = 0;
  int z_count = 0;
  std::vector<double> expected_error(n / bucket, 0.0);
  for (size_t i = 0; i < n; ++i) {
    const double unit = norms[i / bucket] / s;
    const double x = std::fabs(g[i]) / unit;
    const double p = x - std::floor(x);
    const double variance = unit * unit * p * (1 - p);
    expected_error[i / bucket] += variance;
    const double mean = sum[i] / trials;
    if (variance < 1e-12) {
      EXPECT_NEAR(mean, g[i], 1e-5 * unit) << i;
      continue;
    }
    const double z = (mean - g[i]) / std::sqrt(variance / trials);
    EXPECT_LT(std::fabs(z), 5.5) << i;
    z2_sum += z * z;
    ++z_count;
  }
  // Mean of ~1000 squared standard normals: 1 +- 0.045 (sd); 5 sd band.
  EXPECT_NEAR(z2_sum / z_count, 1.0, 0.23);

  for (size_t b = 0; b < n / bucket; ++b) {
    const double norm2 = norms[b] * norms[b];
    const double bound =
        std::min(bucket / (s * s), std::sqrt(static_cast<double>(bucket)) / s) *
        norm2;
    EXPECT_LE(expected_error[b], bound) << b;
    // The measured mean squared error matches the exact expectation (its
    // relative sd over 4000 trials of a sum of 256 terms is well under 1 %).
    EXPECT_NEAR(squared_error[b] / trials, expected_error[b],
                0.05 * expected_error[b])
        << b;
  }
}

TEST(QsgdCodecTest, EncodeRejectsNonFiniteValues) {
  const auto codec = Make(4, 4);
  std::vector<float> g(12, 1.0f);
  g[5] = NAN;
  const int64_t shape[] = {12};
  TensorState state;
  Bytes payload;
  EXPECT_EQ(codec->Encode(TensorView{g, shape}, state, StepContext(), &payload)
                .code(),
            absl::StatusCode::kInvalidArgument);
  g[5] = INFINITY;
  EXPECT_EQ(codec->Encode(TensorView{g, shape}, state, StepContext(), &payload)
                .code(),
            absl::StatusCode::kInvalidArgument);
  // Finite, but the bucket's norm (4.2e38) has no fp32: the message says so.
  g[5] = g[6] = 3e38f;
  const absl::Status status =
      codec->Encode(TensorView{g, shape}, state, StepContext(), &payload);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("norm passes float range"),
            absl::string_view::npos)
      << status;
}

TEST(QsgdCodecTest, EncodesFiniteValuesWhoseSquaresOverflowFp32) {
  // 2e19^2 overflows the fp32 sum of squares; the bucket's norm, about
  // 2e19, does not, and the spike is sent at the full level.
  const auto codec = Make(4, 512);
  std::vector<float> g = Normal(1024, 9);
  g[100] = 2e19f;
  const std::vector<float> q = Decode(*codec, Encode(*codec, g, 0), g.size());
  EXPECT_NEAR(q[100], 2e19f, 1e-6 * 2e19f);
  for (size_t i = 0; i < q.size(); ++i) ASSERT_TRUE(std::isfinite(q[i])) << i;
}

// A bucket of normal floats near 1e-25, whose fp32 squares underflow: its
// norm is taken in double, and the values are sent (before, the bucket's
// norm was 0 and it went as zeros). Each value lands on a level of its own
// bucket's norm, as at ordinary scales.
TEST(QsgdCodecTest, EncodesTinyValuesWhoseSquaresUnderflowFp32) {
  const auto codec = Make(4, 512);
  std::vector<float> g = Normal(1024, 12);
  for (float& v : g) v *= 1e-25f;
  const std::vector<float> q = Decode(*codec, Encode(*codec, g, 0), g.size());
  const std::vector<double> norms = Norms(g, 512);
  size_t nonzero = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const double level = norms[i / 512] / 7;  // 4 bits: 7 levels
    ASSERT_LE(std::fabs(q[i] - g[i]), level * (1 + 1e-5)) << i;
    nonzero += q[i] != 0;
  }
  EXPECT_GT(nonzero, 100u);
}

TEST(QsgdCodecTest, DecodeRejectsBadPayloadsAndLeavesAccUntouched) {
  const auto codec = Make(3, 4);
  const Bytes good = Encode(*codec, Normal(10, 4), 0);  // 3 norms, 4 bytes
  const size_t params = kWireHeaderBytes;
  const size_t norms = params + 8;
  std::vector<float> acc(10, 1.0f);
  const std::vector<float> untouched = acc;
  auto with = [&](size_t offset, const void* bytes, size_t size) {
    Bytes p = good;
    std::memcpy(&p[offset], bytes, size);
    return p;
  };
  const uint32_t zero_bucket = 0;
  const uint8_t nine_bits = 9;
  const uint8_t one_bit = 1;
  const uint8_t nonzero = 1;
  const float nan = NAN;
  const float negative = -1.0f;
  const float inf = INFINITY;
  const uint8_t dirty_padding = 0xC0;  // 30 code bits: top 2 must be 0
  struct Case {
    const char* what;
    Bytes payload;
  } cases[] = {
      {"bucket 0", with(params, &zero_bucket, 4)},
      {"bits 9", with(params + 4, &nine_bits, 1)},
      {"bits 1", with(params + 4, &one_bit, 1)},
      {"reserved byte", with(params + 6, &nonzero, 1)},
      {"NaN norm", with(norms, &nan, 4)},
      {"negative norm", with(norms + 4, &negative, 4)},
      {"infinite norm", with(norms + 8, &inf, 4)},
      {"padding bits", with(good.size() - 1, &dirty_padding, 1)},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(codec->DecodeAdd(c.payload, 1.0f, absl::MakeSpan(acc)).code(),
              absl::StatusCode::kInvalidArgument)
        << c.what;
  }
  // A body sized for another bucket: 4 -> 5 changes the norm count.
  const uint32_t bucket5 = 5;
  EXPECT_EQ(
      codec->DecodeAdd(with(params, &bucket5, 4), 1.0f, absl::MakeSpan(acc))
          .code(),
      absl::StatusCode::kInvalidArgument);
  Bytes truncated = good;
  truncated.pop_back();
  EXPECT_EQ(codec->DecodeAdd(truncated, 1.0f, absl::MakeSpan(acc)).code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<float> wrong_size(11, 0.0f);
  EXPECT_EQ(codec->DecodeAdd(good, 1.0f, absl::MakeSpan(wrong_size)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(acc, untouched);
  EXPECT_TRUE(codec->DecodeAdd(good, 1.0f, absl::MakeSpan(acc)).ok());
}

TEST(QsgdCodecTest, FinishGatherIsTheBaseMeanOfTheDecodes) {
  const auto codec = Make(4, 128);
  std::vector<Bytes> payloads;
  for (int r = 0; r < 3; ++r) {
    payloads.push_back(Encode(*codec, Normal(1000, 20 + r), 0, r));
  }
  const std::vector<float> direct =
      testing::ExpectGatherMatchesTheDefault(*codec, payloads, 1000);
  EXPECT_NE(direct, std::vector<float>(1000, 7.0f));
}

TEST(QsgdCodecTest, FinishGatherWithABadPayloadLeavesOutputUntouched) {
  const auto codec = Make(3, 4);
  Bytes bad = Encode(*codec, Normal(10, 5), 0, 1);
  const float nan = NAN;
  std::memcpy(&bad[kWireHeaderBytes + 8], &nan, sizeof(nan));  // first norm
  const std::vector<Bytes> payloads = {Encode(*codec, Normal(10, 4), 0, 0),
                                       bad};
  testing::ExpectGatherRefusedLikeTheDefault(
      *codec, payloads, 10, "qsgd: payload of rank 1: qsgd: bucket 0 has norm");
}

TEST(QsgdCodecTest, DecodesWhateverValidBucketAndBitsThePayloadNames) {
  const std::vector<float> g = Normal(100, 5);
  const Bytes payload = Encode(*Make(6, 10), g, 0);
  EXPECT_EQ(Decode(*Make(4, 512), payload, g.size()),
            Decode(*Make(6, 10), payload, g.size()));
}

TEST(QsgdCodecTest, CreateRejectsBadParameters) {
  for (const auto& [key, value] :
       std::vector<std::pair<std::string, std::string>>{{"bits", "1"},
                                                        {"bits", "9"},
                                                        {"bucket", "0"},
                                                        {"bucket", "2000000"},
                                                        {"levels", "3"}}) {
    EXPECT_EQ(QsgdCodec::Create(CodecParams({{key, value}})).status().code(),
              absl::StatusCode::kInvalidArgument)
        << key << "=" << value;
  }
}

TEST(QsgdCodecTest, RegistersUnderItsName) {
  CodecRegistry registry;
  ASSERT_TRUE(RegisterQsgd(registry).ok());
  const auto codec = registry.Create("qsgd", CodecParams({{"bits", "8"}}));
  ASSERT_TRUE(codec.ok()) << codec.status();
  EXPECT_EQ((*codec)->info().id, CodecId::kQsgd);
  EXPECT_TRUE((*codec)->info().unbiased);
}

}  // namespace
}  // namespace gradcomp::codecs
