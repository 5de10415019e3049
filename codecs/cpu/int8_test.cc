#include "codecs/cpu/int8.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "codecs/registry.h"
#include "codecs/state.h"
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

std::unique_ptr<Int8Codec> Make(int bucket, bool stochastic) {
  auto codec = Int8Codec::Create(
      CodecParams({{"bucket", std::to_string(bucket)},
                   {"stochastic", stochastic ? "true" : "false"}}));
  EXPECT_TRUE(codec.ok()) << codec.status();
  return std::move(codec).value();
}

Bytes Encode(const Int8Codec& codec, const std::vector<float>& g,
             int64_t step = 0) {
  const int64_t shape[] = {static_cast<int64_t>(g.size())};
  TensorState state;
  StepContext ctx;
  ctx.seed = 5;
  ctx.step = step;
  Bytes payload;
  const absl::Status status =
      codec.Encode(TensorView{g, shape}, state, ctx, &payload);
  EXPECT_TRUE(status.ok()) << status;
  return payload;
}

std::vector<float> Decode(const Int8Codec& codec, const Bytes& payload,
                          size_t n) {
  std::vector<float> out(n, 0.0f);
  const absl::Status status =
      codec.DecodeAdd(payload, 1.0f, absl::MakeSpan(out));
  EXPECT_TRUE(status.ok()) << status;
  return out;
}

// (max - min) / 255 of each bucket, in double.
std::vector<double> Steps(const std::vector<float>& x, size_t bucket) {
  std::vector<double> steps;
  for (size_t b = 0; b < x.size(); b += bucket) {
    const auto [lo, hi] = std::minmax_element(
        x.begin() + b, x.begin() + std::min(b + bucket, x.size()));
    steps.push_back((static_cast<double>(*hi) - *lo) / 255.0);
  }
  return steps;
}

TEST(Int8CodecTest, PayloadIsRangesThenOneBytePerValue) {
  const std::vector<float> g = Normal(1001, 1);
  EXPECT_EQ(Encode(*Make(100, false), g).size(),
            kWireHeaderBytes + 8 + 11 * 8 + 1001);
  EXPECT_EQ(Encode(*Make(1024, true), g).size(),
            kWireHeaderBytes + 8 + 1 * 8 + 1001);
}

TEST(Int8CodecTest, ParseNamesTheBucketRoundingAndBody) {
  const std::vector<float> g = Normal(1001, 1);
  const Bytes p = Encode(*Make(100, true), g);
  const absl::StatusOr<Int8Payload> parsed = ParseInt8Payload(p, g.size());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->bucket, 100u);
  EXPECT_TRUE(parsed->stochastic);
  EXPECT_EQ(parsed->buckets, 11u);
  EXPECT_EQ(parsed->body, absl::string_view(p).substr(kWireHeaderBytes + 8));
  EXPECT_FALSE(
      ParseInt8Payload(Encode(*Make(100, false), g), g.size())->stochastic);
  EXPECT_EQ(ParseInt8Payload(p, g.size() + 1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(Int8CodecTest, NearestIsWithinHalfAStep) {
  // Threaded path (3M values) and a bucket that does not divide n. The
  // level is computed in fp32 near 255, a few ulps (~1e-4 of a step) off,
  // and min + q * step adds an ulp of the value.
  const auto codec = Make(1000, false);
  std::vector<float> g = Normal(3'000'017, 2);
  for (size_t i = 0; i < g.size(); ++i) g[i] *= 1 + static_cast<float>(i % 7);
  const std::vector<float> q = Decode(*codec, Encode(*codec, g), g.size());
  const std::vector<double> steps = Steps(g, 1000);
  for (size_t i = 0; i < g.size(); ++i) {
    const double tolerance =
        steps[i / 1000] * (0.5 + 2e-4) +
        4 * std::numeric_limits<float>::epsilon() * std::fabs(g[i]);
    ASSERT_LE(std::fabs(q[i] - g[i]), tolerance) << i;
  }
}

TEST(Int8CodecTest, StochasticIsUnbiasedWithTheVarianceOfTheRounding) {
  // q = floor(x + u): E = x, so E[decoded] = v; Var = step^2 p (1 - p) with
  // p the fraction of x. Over T encodes each z-score must stay within 5.5
  // and their mean square near 1 (about 1000 z^2: sd 0.045, a 5 sd band).
  // Every single decode is also within one step.
  const size_t n = 1024;
  const size_t bucket = 256;
  const int trials = 3000;
  const auto codec = Make(bucket, true);
  EXPECT_TRUE(codec->info().unbiased);
  std::vector<float> g = Normal(n, 3);
  for (size_t i = 0; i < n; ++i) g[i] *= static_cast<float>(1 + i / bucket);
  const std::vector<double> steps = Steps(g, bucket);
  std::vector<double> sum(n, 0.0);
  for (int t = 0; t < trials; ++t) {
    const std::vector<float> q = Decode(*codec, Encode(*codec, g, t), n);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_LE(std::fabs(q[i] - g[i]), steps[i / bucket] * (1 + 1e-4)) << i;
      sum[i] += q[i];
    }
  }
  double z2 = 0;
  int count = 0;
  for (size_t i = 0; i < n; ++i) {
    const double step = steps[i / bucket];
    const double x =
        (g[i] - *std::min_element(g.begin() + i / bucket * bucket,
                                  g.begin() + (i / bucket + 1) * bucket)) /
        step;
    const double p = x - std::floor(x);
    const double variance = step * step * p * (1 - p);
    const double mean = sum[i] / trials;
    if (variance < 1e-6 * step * step) {
      EXPECT_NEAR(mean, g[i], 1e-3 * step) << i;
      continue;
    }
    const double z = (mean - g[i]) / std::sqrt(variance / trials);
    EXPECT_LT(std::fabs(z), 5.5) << i;
    z2 += z * z;
    ++count;
  }
  EXPECT_NEAR(z2 / count, 1.0, 0.23);
}

// Buckets far from 0 next to their range (1e5 + 0.01 i; fp32's spacing
// is 1 at lo * 255 / range = 1e7): the levels sent must still be the
// exact (x - lo) * 255 / range, nearest or unbiased. Checked on the level
// bytes, since a decode near 1e5 rounds to fp32's grid of 1/128 there.
TEST(Int8CodecTest, LevelsOfBucketsFarFromZeroAreExactOnAverage) {
  constexpr size_t kBucket = 256;
  constexpr int kTrials = 2000;
  std::vector<float> g(2 * kBucket);
  for (size_t i = 0; i < g.size(); ++i) {
    g[i] = static_cast<float>((i < kBucket ? 1e5 : -3e4) + 0.01 * i);
  }
  // The exact level of each value, in double.
  std::vector<double> level(g.size());
  for (size_t b = 0; b < g.size(); b += kBucket) {
    const auto [lo, hi] =
        std::minmax_element(g.begin() + b, g.begin() + b + kBucket);
    for (size_t i = b; i < b + kBucket; ++i) {
      level[i] = (double{g[i]} - *lo) * 255 / (double{*hi} - *lo);
    }
  }
  const auto codes = [&](const Int8Codec& codec, int64_t step) {
    const Bytes payload = Encode(codec, g, step);
    const absl::StatusOr<Int8Payload> parsed =
        ParseInt8Payload(payload, g.size());
    EXPECT_TRUE(parsed.ok()) << parsed.status();
    const absl::string_view bytes = parsed->body.substr(8 * parsed->buckets);
    return std::vector<uint8_t>(bytes.begin(), bytes.end());
  };
  const std::vector<uint8_t> nearest = codes(*Make(kBucket, false), 0);
  for (size_t i = 0; i < g.size(); ++i) {
    EXPECT_LE(std::fabs(nearest[i] - level[i]), 0.5 + 1e-3) << i;
  }
  // Each mean of kTrials draws has sd at most 0.5 / sqrt(kTrials) = 0.011.
  const auto stochastic = Make(kBucket, true);
  std::vector<double> sum(g.size(), 0.0);
  for (int t = 0; t < kTrials; ++t) {
    const std::vector<uint8_t> q = codes(*stochastic, t);
    for (size_t i = 0; i < g.size(); ++i) sum[i] += q[i];
  }
  for (size_t i = 0; i < g.size(); ++i) {
    EXPECT_NEAR(sum[i] / kTrials, level[i], 0.06) << i;
  }
}

TEST(Int8CodecTest, NearestIsDeterministicAndStochasticFollowsTheStream) {
  const std::vector<float> g = Normal(4096, 4);
  EXPECT_EQ(Encode(*Make(512, false), g, 1), Encode(*Make(512, false), g, 2));
  EXPECT_EQ(Encode(*Make(512, true), g, 1), Encode(*Make(512, true), g, 1));
  EXPECT_NE(Encode(*Make(512, true), g, 1), Encode(*Make(512, true), g, 2));
}

TEST(Int8CodecTest, ConstantBucketsAndExtremesAreExact) {
  const auto codec = Make(4, false);
  const float big = std::numeric_limits<float>::max();
  // A constant bucket, a bucket spanning more than FLT_MAX, zeros.
  const std::vector<float> g = {2.5f, 2.5f, 2.5f, 2.5f, -big, big,
                                0.0f, big,  0.0f, 0.0f, 0.0f, 0.0f};
  const std::vector<float> q = Decode(*codec, Encode(*codec, g), g.size());
  for (size_t i = 0; i < g.size(); ++i) {
    EXPECT_TRUE(std::isfinite(q[i])) << i;
  }
  for (size_t i : {0, 1, 2, 3, 4, 8, 9, 10, 11}) EXPECT_EQ(q[i], g[i]) << i;
  EXPECT_NEAR(q[5], big, big / 200);
}

TEST(Int8CodecTest, EncodeRejectsNonFiniteValues) {
  const auto codec = Make(4, false);
  const int64_t shape[] = {12};
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    std::vector<float> g(12, 1.0f);
    g[6] = bad;
    TensorState state;
    Bytes payload;
    EXPECT_EQ(
        codec->Encode(TensorView{g, shape}, state, StepContext(), &payload)
            .code(),
        absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

TEST(Int8CodecTest, DecodeRejectsBadRangesAndParameters) {
  const auto codec = Make(4, false);
  const Bytes good = Encode(*codec, Normal(10, 5));
  const size_t params = kWireHeaderBytes;
  const size_t ranges = params + 8;
  auto expect_rejected = [&](size_t offset, const void* bytes, size_t size) {
    Bytes bad = good;
    std::memcpy(&bad[offset], bytes, size);
    std::vector<float> acc(10, 1.0f);
    EXPECT_EQ(codec->DecodeAdd(bad, 1.0f, absl::MakeSpan(acc)).code(),
              absl::StatusCode::kInvalidArgument)
        << offset;
    EXPECT_EQ(acc, std::vector<float>(10, 1.0f));
  };
  const float nan = NAN, inf = INFINITY, huge = 1e30f, tiny = -1e30f;
  expect_rejected(ranges + 8, &nan, 4);    // bucket 1 min
  expect_rejected(ranges + 12, &inf, 4);   // bucket 1 max
  expect_rejected(ranges + 16, &huge, 4);  // bucket 2 min > max
  expect_rejected(ranges + 4, &tiny, 4);   // bucket 0 max < min
  const uint32_t zero = 0, too_big = (1u << 20) + 1;
  expect_rejected(params, &zero, 4);
  expect_rejected(params, &too_big, 4);
  const uint8_t rounding = 2;
  expect_rejected(params + 4, &rounding, 1);
  expect_rejected(params + 6, &rounding, 1);
  // A bucket of 5 implies 2 ranges, not 3: the body length no longer fits.
  const uint32_t five = 5;
  expect_rejected(params, &five, 4);
}

}  // namespace
}  // namespace gradcomp::codecs
