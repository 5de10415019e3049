#include "codecs/cpu/terngrad.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
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

std::unique_ptr<TernGradCodec> Make(int bucket, double clip_sigma) {
  auto codec = TernGradCodec::Create(
      CodecParams({{"bucket", std::to_string(bucket)},
                   {"clip_sigma", std::to_string(clip_sigma)}}));
  EXPECT_TRUE(codec.ok()) << codec.status();
  return std::move(codec).value();
}

Bytes Encode(const TernGradCodec& codec, const std::vector<float>& g,
             int64_t step = 0, int rank = 0) {
  const int64_t shape[] = {static_cast<int64_t>(g.size())};
  TensorState state;
  StepContext ctx;
  ctx.seed = 23;
  ctx.step = step;
  ctx.rank = rank;
  Bytes payload;
  const absl::Status status =
      codec.Encode(TensorView{g, shape}, state, ctx, &payload);
  EXPECT_TRUE(status.ok()) << status;
  return payload;
}

std::vector<float> Decode(const TernGradCodec& codec, const Bytes& payload,
                          size_t n) {
  std::vector<float> out(n, 0.0f);
  const absl::Status status =
      codec.DecodeAdd(payload, 1.0f, absl::MakeSpan(out));
  EXPECT_TRUE(status.ok()) << status;
  return out;
}

// The clipping bound c * RMS(x) (infinite when c = 0) and the values clipped
// to it, in double.
double ClipOf(const std::vector<float>& x, double c) {
  if (c == 0) return INFINITY;
  double s = 0;
  for (float v : x) s += static_cast<double>(v) * v;
  return c * std::sqrt(s / x.size());
}

// Scale of each bucket: max |clipped x|.
std::vector<double> Scales(const std::vector<float>& x, size_t bucket,
                           double clip) {
  std::vector<double> scales((x.size() + bucket - 1) / bucket, 0.0);
  for (size_t i = 0; i < x.size(); ++i) {
    double& s = scales[i / bucket];
    s = std::max(s, std::min<double>(std::fabs(x[i]), clip));
  }
  return scales;
}

TEST(TernGradCodecTest, PacksFourTwoBitCodesPerByte) {
  // Values at +-max are sent with probability 1, zeros never: the bytes are
  // fixed whatever the stream. Codes 1, 2, 0, 0 | 1 -> 0x09, 0x01.
  const auto codec = Make(8, 0);
  const Bytes p = Encode(*codec, {1.5f, -1.5f, 0.0f, -0.0f, 1.5f});
  ASSERT_EQ(p.size(), kWireHeaderBytes + 8 + 4 + 2);
  float scale;
  std::memcpy(&scale, p.data() + kWireHeaderBytes + 8, 4);
  EXPECT_EQ(scale, 1.5f);
  EXPECT_EQ(static_cast<uint8_t>(p[kWireHeaderBytes + 12]), 0x09);
  EXPECT_EQ(static_cast<uint8_t>(p[kWireHeaderBytes + 13]), 0x01);
  EXPECT_EQ(Decode(*codec, p, 5),
            (std::vector<float>{1.5f, -1.5f, 0.0f, 0.0f, 1.5f}));
}

TEST(TernGradCodecTest, EveryValueIsZeroOrTheBucketScaleWithItsSign) {
  // Threaded path (3M values), a bucket that does not divide n, with and
  // without clipping: Q_i in {0, sign(v_i) s}, s = min(max |v|, c sigma), so
  // |Q_i - clip(v_i)| <= s.
  for (double c : {0.0, 2.5}) {
    const auto codec = Make(500, c);
    std::vector<float> g = Normal(3'000'017, 8);
    for (size_t i = 0; i < g.size(); ++i) g[i] *= 1 + static_cast<float>(i % 5);
    const std::vector<float> q = Decode(*codec, Encode(*codec, g), g.size());
    const double clip = ClipOf(g, c);
    const std::vector<double> scales = Scales(g, 500, clip);
    size_t nonzero = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      if (q[i] == 0) continue;
      ++nonzero;
      ASSERT_NEAR(std::fabs(q[i]), scales[i / 500], 1e-6 * scales[i / 500])
          << c << " " << i;
      ASSERT_EQ(std::signbit(q[i]), std::signbit(g[i])) << i;
    }
    // About sum |v'| / s of the values are sent: well between 10 % and 90 %.
    EXPECT_GT(nonzero, g.size() / 10);
    EXPECT_LT(nonzero, g.size() * 9 / 10);
  }
}

TEST(TernGradCodecTest, UnbiasedForTheClippedValues) {
  // Q_i = s sign(v_i) Bernoulli(|v'_i| / s): E[Q_i] = v'_i (v_i itself when
  // clipping is off) and Var[Q_i] = s |v'_i| - v'_i^2. Over T encodes each
  // z-score must stay within 5.5 and their mean square near 1 (about 1000
  // z^2: sd 0.045, a 5 sd band).
  const size_t n = 1024;
  const size_t bucket = 256;
  const int trials = 3000;
  for (double c : {0.0, 1.5}) {
    const auto codec = Make(bucket, c);
    EXPECT_EQ(codec->info().unbiased, c == 0);
    std::vector<float> g = Normal(n, 9);
    for (size_t i = 0; i < n; ++i) g[i] *= static_cast<float>(1 + i / bucket);
    const double clip = ClipOf(g, c);
    const std::vector<double> scales = Scales(g, bucket, clip);
    std::vector<double> sum(n, 0.0);
    for (int t = 0; t < trials; ++t) {
      const std::vector<float> q = Decode(*codec, Encode(*codec, g, t), n);
      for (size_t i = 0; i < n; ++i) sum[i] += q[i];
    }
    double z2 = 0;
    int count = 0;
    for (size_t i = 0; i < n; ++i) {
      const double a = std::min<double>(std::fabs(g[i]), clip);
      const double target = std::copysign(a, g[i]);
      const double variance = scales[i / bucket] * a - a * a;
      const double mean = sum[i] / trials;
      if (variance < 1e-9) {
        EXPECT_NEAR(mean, target, 1e-5 * scales[i / bucket]) << i;
        continue;
      }
      const double z = (mean - target) / std::sqrt(variance / trials);
      EXPECT_LT(std::fabs(z), 5.5) << c << " " << i;
      z2 += z * z;
      ++count;
    }
    EXPECT_NEAR(z2 / count, 1.0, 0.23) << c;
  }
}

TEST(TernGradCodecTest, RanksAndStepsDrawIndependently) {
  const auto codec = Make(512, 2.5);
  const std::vector<float> g = Normal(4096, 10);
  EXPECT_EQ(Encode(*codec, g, 1), Encode(*codec, g, 1));
  EXPECT_NE(Encode(*codec, g, 1), Encode(*codec, g, 2));
  EXPECT_NE(Encode(*codec, g, 1, 0), Encode(*codec, g, 1, 1));
}

TEST(TernGradCodecTest, EncodeRejectsNonFiniteValues) {
  const int64_t shape[] = {12};
  for (double c : {0.0, 2.5}) {
    const auto codec = Make(4, c);
    for (float bad : {NAN, INFINITY}) {
      std::vector<float> g(12, 1.0f);
      g[7] = bad;
      TensorState state;
      Bytes payload;
      EXPECT_EQ(
          codec->Encode(TensorView{g, shape}, state, StepContext(), &payload)
              .code(),
          absl::StatusCode::kInvalidArgument)
          << c << " " << bad;
    }
  }
}

TEST(TernGradCodecTest, ClipsFiniteValuesWhoseSquaresOverflowFp32) {
  // 2e19^2 overflows an fp32 sum of squares; the clip sigma * 2.5 is finite.
  const auto codec = Make(512, 2.5);
  std::vector<float> g = Normal(1024, 4);
  g[100] = 2e19f;
  const std::vector<float> q = Decode(*codec, Encode(*codec, g), g.size());
  const float clip = static_cast<float>(ClipOf(g, 2.5));
  for (size_t i = 0; i < q.size(); ++i) {
    ASSERT_TRUE(q[i] == 0 || std::fabs(q[i]) <= clip * (1 + 1e-6f)) << i;
  }
}

// Normal floats near 1e-25: the clip (2.5 sigma) comes from a double sum
// of squares, not from an fp32 one that underflowed to 0 and zeroed every
// value.
TEST(TernGradCodecTest, ClipsTinyValuesWhoseSquaresUnderflowFp32) {
  const auto codec = Make(512, 2.5);
  std::vector<float> g = Normal(1024, 6);
  for (float& v : g) v *= 1e-25f;
  const std::vector<float> q = Decode(*codec, Encode(*codec, g), g.size());
  const float clip = static_cast<float>(ClipOf(g, 2.5));
  ASSERT_GT(clip, 0);
  size_t nonzero = 0;
  for (size_t i = 0; i < q.size(); ++i) {
    ASSERT_TRUE(q[i] == 0 || std::fabs(q[i]) <= clip * (1 + 1e-6f)) << i;
    nonzero += q[i] != 0;
  }
  EXPECT_GT(nonzero, 100u);
}

TEST(TernGradCodecTest, DecodeRejectsBadCodesScalesAndPadding) {
  const auto codec = Make(4, 0);
  // 10 values: 3 scales, 3 code bytes, the last with 4 padding bits.
  const Bytes good = Encode(*codec, {1, -1, 1, -1, 2, 0, 0, 0, 3, 3});
  const size_t scales = kWireHeaderBytes + 8;
  const size_t codes = scales + 12;
  ASSERT_EQ(good.size(), codes + 3);
  auto expect_rejected = [&](size_t offset, const void* bytes, size_t size) {
    Bytes bad = good;
    std::memcpy(&bad[offset], bytes, size);
    std::vector<float> acc(10, 1.0f);
    EXPECT_EQ(codec->DecodeAdd(bad, 1.0f, absl::MakeSpan(acc)).code(),
              absl::StatusCode::kInvalidArgument)
        << offset;
    EXPECT_EQ(acc, std::vector<float>(10, 1.0f));
  };
  const uint8_t three = 0x03, three_high = 0xC0, padding = 0x15;
  expect_rejected(codes, &three, 1);
  expect_rejected(codes + 1, &three_high, 1);
  expect_rejected(codes + 2, &padding, 1);
  const float negative = -1, nan = NAN;
  expect_rejected(scales + 4, &negative, 4);
  expect_rejected(scales + 8, &nan, 4);
  const uint32_t zero = 0;
  expect_rejected(kWireHeaderBytes, &zero, 4);
  const uint8_t one = 1;
  expect_rejected(kWireHeaderBytes + 5, &one, 1);
}

TEST(TernGradCodecTest, RejectsBadParameters) {
  for (const auto& params :
       std::vector<std::map<std::string, std::string>>{{{"bucket", "0"}},
                                                       {{"clip_sigma", "-1"}},
                                                       {{"clip_sigma", "inf"}},
                                                       {{"clip", "2"}}}) {
    EXPECT_EQ(TernGradCodec::Create(CodecParams(params)).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
}

TEST(TernGradCodecTest, ParseTernGradPayloadGivesTheBucketsAndTheBody) {
  const std::vector<float> g = Normal(10, 4);
  const Bytes payload = Encode(*Make(4, 0), g);
  const absl::StatusOr<TernGradPayload> p = ParseTernGradPayload(payload, 10);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->bucket, 4u);
  EXPECT_EQ(p->buckets, 3u);
  // The header, the 8 parameter bytes, then 3 scales and ceil(10 / 4) bytes
  // of codes.
  EXPECT_EQ(p->body.data(), payload.data() + kWireHeaderBytes + 8);
  EXPECT_EQ(p->body.size(), 4u * 3 + 3);
  float scale0;
  std::memcpy(&scale0, p->body.data(), sizeof(scale0));
  EXPECT_EQ(scale0, std::max({std::fabs(g[0]), std::fabs(g[1]), std::fabs(g[2]),
                              std::fabs(g[3])}));

  EXPECT_EQ(ParseTernGradPayload(payload, 11).status().code(),
            absl::StatusCode::kInvalidArgument);
  Bytes bad = payload;
  bad[kWireHeaderBytes + 8 + 12] = static_cast<char>(0x03);  // code 3
  const absl::Status s = ParseTernGradPayload(bad, 10).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("found a 3"), absl::string_view::npos) << s;
}

}  // namespace
}  // namespace gradcomp::codecs
