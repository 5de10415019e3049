#include "codecs/cpu/topk.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "base/status_macros.h"
#include "codecs/cpu/sparse_payload.h"
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

std::unique_ptr<TopKCodec> Make(std::map<std::string, std::string> params) {
  absl::StatusOr<std::unique_ptr<TopKCodec>> codec =
      TopKCodec::Create(CodecParams(std::move(params)));
  EXPECT_TRUE(codec.ok()) << codec.status();
  return std::move(codec).value();
}

struct Encoded {
  Bytes payload;
  std::vector<float> dense;  // the payload scattered into a zero tensor
  std::vector<uint32_t> indices;
};

Encoded EncodeStep(const TopKCodec& codec, const std::vector<float>& g,
                   TensorState& state, int64_t step) {
  const int64_t shape[] = {static_cast<int64_t>(g.size())};
  StepContext ctx;
  ctx.seed = 5;
  ctx.step = step;
  Encoded out;
  EXPECT_TRUE(
      codec.Encode(TensorView{g, shape}, state, ctx, &out.payload).ok());
  out.dense.assign(g.size(), 0.0f);
  EXPECT_TRUE(
      codec.DecodeAdd(out.payload, 1.0f, absl::MakeSpan(out.dense)).ok());
  for (size_t i = 0; i < g.size(); ++i) {
    if (out.dense[i] != 0) out.indices.push_back(static_cast<uint32_t>(i));
  }
  return out;
}

std::vector<float> Buffer(TensorState& state, const char* name) {
  const absl::Span<float> b = *state.Find(name);
  return std::vector<float>(b.begin(), b.end());
}

TEST(TopKCodecTest, VelocityInvariantHoldsAcrossSteps) {
  // v_before + u = v_after + scatter(sent), u the momentum after its update.
  const auto codec = Make({{"ratio", "0.01"}, {"masking", "false"}});
  TensorState state;
  const size_t n = 50000;
  for (int step = 0; step < 5; ++step) {
    const std::vector<float> g = Normal(n, 100 + step);
    std::vector<float> v_before(n, 0.0f);
    if (step > 0) v_before = Buffer(state, MomentumCorrection::kVelocityBuffer);
    const Encoded e = EncodeStep(*codec, g, state, step);
    const std::vector<float> u =
        Buffer(state, MomentumCorrection::kMomentumBuffer);
    const std::vector<float> v_after =
        Buffer(state, MomentumCorrection::kVelocityBuffer);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(v_before[i] + u[i], v_after[i] + e.dense[i]) << i;
    }
  }
}

// After the first step u, v and g differ: the k sent are the k largest of
// the velocity the step accumulated (v_before + u), and their values.
TEST(TopKCodecTest, LaterStepsSendTheTopKOfTheAccumulatedVelocity) {
  const auto codec = Make({{"ratio", "0.01"},
                           {"sample", "1"},
                           {"momentum", "0.9"},
                           {"masking", "false"}});
  TensorState state;
  const size_t n = 20000;
  for (int step = 0; step < 4; ++step) {
    std::vector<float> v_before(n, 0.0f);
    if (step > 0) v_before = Buffer(state, MomentumCorrection::kVelocityBuffer);
    const Encoded e = EncodeStep(*codec, Normal(n, 300 + step), state, step);
    const std::vector<float> u =
        Buffer(state, MomentumCorrection::kMomentumBuffer);
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = v_before[i] + u[i];
    std::vector<uint32_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
      return std::fabs(v[a]) > std::fabs(v[b]);
    });
    order.resize(200);
    std::sort(order.begin(), order.end());
    EXPECT_EQ(e.indices, order) << "step " << step;
    for (uint32_t i : e.indices) EXPECT_EQ(e.dense[i], v[i]) << i;
  }
}

TEST(TopKCodecTest, SendsAtMostKAndCloseToK) {
  const auto codec = Make({});  // ratio 0.001, sample 1 %
  TensorState state;
  const size_t n = 1'000'000;
  for (int step = 0; step < 3; ++step) {
    const Encoded e = EncodeStep(*codec, Normal(n, step), state, step);
    EXPECT_LE(e.indices.size(), 1000u);
    EXPECT_GE(e.indices.size(), 800u);
  }
}

TEST(TopKCodecTest, FullSampleSelectsTheExactTopK) {
  const auto codec = Make({{"ratio", "0.01"}, {"sample", "1"}});
  TensorState state;
  const std::vector<float> g = Normal(20000, 3);
  const Encoded e = EncodeStep(*codec, g, state, 0);
  // First step: u = g, v = g, so the top k of |g| go.
  std::vector<uint32_t> order(g.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    return std::fabs(g[a]) > std::fabs(g[b]);
  });
  order.resize(200);
  std::sort(order.begin(), order.end());
  EXPECT_EQ(e.indices, order);
  for (uint32_t i : e.indices) EXPECT_EQ(e.dense[i], g[i]);
}

TEST(TopKCodecTest, MaskingClearsMomentumOfSentCoordinates) {
  const auto codec = Make({{"ratio", "0.05"}, {"momentum", "0.9"}});
  TensorState state;
  const std::vector<float> g = Normal(10000, 4);
  const Encoded e = EncodeStep(*codec, g, state, 0);
  const std::vector<float> u =
      Buffer(state, MomentumCorrection::kMomentumBuffer);
  const std::vector<float> v =
      Buffer(state, MomentumCorrection::kVelocityBuffer);
  std::vector<bool> sent(g.size());
  for (uint32_t i : e.indices) sent[i] = true;
  for (size_t i = 0; i < g.size(); ++i) {
    EXPECT_EQ(u[i], sent[i] ? 0.0f : g[i]) << i;
    EXPECT_EQ(v[i], sent[i] ? 0.0f : g[i]) << i;
  }
}

// The GPU twin's selection can fail after the momentum correction ran:
// the state is then as it was, for classic and Nesterov momentum.
TEST(TopKCodecTest, AFailedSelectionLeavesTheStateAsItWas) {
  for (const char* nesterov : {"false", "true"}) {
    const auto codec =
        Make({{"ratio", "0.05"}, {"momentum", "0.9"}, {"nesterov", nesterov}});
    TensorState state;
    EncodeStep(*codec, Normal(10000, 4), state, 0);
    const std::vector<float> u =
        Buffer(state, MomentumCorrection::kMomentumBuffer);
    const std::vector<float> v =
        Buffer(state, MomentumCorrection::kVelocityBuffer);
    const std::vector<float> g = Normal(10000, 5);
    const int64_t shape[] = {10000};
    Bytes payload;
    const absl::Status failed = codec->EncodeWith(
        TensorView{g, shape}, state, StepContext(),
        [](absl::Span<const float>, size_t, double,
           const PhiloxStream&) -> absl::StatusOr<TopKSelection> {
          return absl::ResourceExhaustedError("out of device memory");
        },
        &payload);
    EXPECT_TRUE(absl::IsResourceExhausted(failed)) << failed;
    const std::vector<float> u_after =
        Buffer(state, MomentumCorrection::kMomentumBuffer);
    const std::vector<float> v_after =
        Buffer(state, MomentumCorrection::kVelocityBuffer);
    for (size_t i = 0; i < g.size(); ++i) {
      ASSERT_NEAR(u_after[i], u[i], 1e-5)
          << "nesterov " << nesterov << " " << i;
      ASSERT_NEAR(v_after[i], v[i], 1e-5)
          << "nesterov " << nesterov << " " << i;
    }
  }
}

TEST(TopKCodecTest, RatioOneWithoutMaskingIsDenseMomentumSgd) {
  for (bool nesterov : {false, true}) {
    const auto codec = Make({{"ratio", "1"},
                             {"masking", "false"},
                             {"momentum", "0.9"},
                             {"nesterov", nesterov ? "true" : "false"}});
    TensorState state;
    const size_t n = 1000;
    std::vector<float> momentum(n, 0.0f);
    for (int step = 0; step < 4; ++step) {
      const std::vector<float> g = Normal(n, 40 + step);
      const Encoded e = EncodeStep(*codec, g, state, step);
      for (size_t i = 0; i < n; ++i) {
        float update;
        if (nesterov) {
          momentum[i] = (momentum[i] + g[i]) * 0.9f;
          update = momentum[i] + g[i];
        } else {
          momentum[i] = 0.9f * momentum[i] + g[i];
          update = momentum[i];
        }
        ASSERT_FLOAT_EQ(e.dense[i], update) << step << " " << i;
      }
    }
  }
}

TEST(TopKCodecTest, NonFiniteVelocityIsRefusedAndRestartsFromZero) {
  // No payload may carry NaN or Inf (peers refuse it); a velocity that holds
  // one would fail every later step if it stayed in the state.
  const auto codec = Make({{"ratio", "0.001"}, {"momentum", "0"}});
  const int64_t shape[] = {100000};
  StepContext ctx;
  for (float bad : {NAN, -INFINITY}) {
    TensorState state;
    std::vector<float> g = Normal(100000, 8);
    g[4242] = bad;
    g[77] = bad;
    Bytes payload;
    const absl::Status status =
        codec->Encode(TensorView{g, shape}, state, ctx, &payload);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(status.message().find("first at index 77"), std::string::npos)
        << status;
    // The finite coordinates are given the step back: as before it, empty.
    const std::vector<float> zeros(g.size(), 0.0f);
    EXPECT_EQ(Buffer(state, MomentumCorrection::kVelocityBuffer), zeros);
    EXPECT_EQ(Buffer(state, MomentumCorrection::kMomentumBuffer), zeros);
    const Encoded next = EncodeStep(*codec, Normal(100000, 9), state, 1);
    EXPECT_FALSE(next.indices.empty());
  }
}

TEST(TopKCodecTest, OverflowingMomentumIsRefusedAndRestartsFromZero) {
  const auto codec = Make({{"ratio", "0.5"}, {"masking", "false"}});
  const int64_t shape[] = {4};
  const std::vector<float> g = {3e38f, 1.0f, -1.0f, 0.5f};
  TensorState state;
  StepContext ctx;
  Bytes payload;
  ASSERT_TRUE(codec->Encode(TensorView{g, shape}, state, ctx, &payload).ok());
  const std::vector<float> v1 =
      Buffer(state, MomentumCorrection::kVelocityBuffer);
  const std::vector<float> u1 =
      Buffer(state, MomentumCorrection::kMomentumBuffer);
  // u = 0.9 * 3e38 + 3e38 overflows.
  EXPECT_EQ(codec->Encode(TensorView{g, shape}, state, ctx, &payload).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Buffer(state, MomentumCorrection::kVelocityBuffer)[0], 0.0f);
  EXPECT_EQ(Buffer(state, MomentumCorrection::kMomentumBuffer)[0], 0.0f);
  // The other coordinates are as after the first step, to within rounding
  // (u is divided by m again): a step run again does not count g twice.
  for (int i = 1; i < 4; ++i) {
    EXPECT_NEAR(Buffer(state, MomentumCorrection::kVelocityBuffer)[i], v1[i],
                1e-6)
        << i;
    EXPECT_NEAR(Buffer(state, MomentumCorrection::kMomentumBuffer)[i], u1[i],
                1e-6)
        << i;
  }
  EXPECT_TRUE(codec->Encode(TensorView{g, shape}, state, ctx, &payload).ok());
}

TEST(TopKCodecTest, ClippingScalesTheGradientToClipNorm) {
  const auto codec = Make({{"ratio", "1"}, {"clip_norm", "0.5"}});
  TensorState state;
  const std::vector<float> g = {3, 0, -4};  // norm 5
  const Encoded e = EncodeStep(*codec, g, state, 0);
  EXPECT_FLOAT_EQ(e.dense[0], 0.3f);
  EXPECT_FLOAT_EQ(e.dense[2], -0.4f);
}

TEST(TopKCodecTest, WarmupDensityScheduleByStep) {
  const auto codec =
      Make({{"ratio", "0.001"}, {"warmup_steps_per_stage", "10"}});
  EXPECT_DOUBLE_EQ(codec->DensityAt(0), 0.25);
  EXPECT_DOUBLE_EQ(codec->DensityAt(9), 0.25);
  EXPECT_DOUBLE_EQ(codec->DensityAt(10), 0.0625);
  EXPECT_DOUBLE_EQ(codec->DensityAt(25), 0.0156);
  EXPECT_DOUBLE_EQ(codec->DensityAt(39), 0.004);
  EXPECT_DOUBLE_EQ(codec->DensityAt(40), 0.001);
  EXPECT_EQ(codec->KAt(25'000'000, 1000), 25000u);
  EXPECT_EQ(codec->KAt(10, 1000), 1u);
  EXPECT_EQ(codec->KAt(0, 1000), 0u);
  const auto no_warmup = Make({{"ratio", "0.01"}});
  EXPECT_DOUBLE_EQ(no_warmup->DensityAt(0), 0.01);
}

TEST(TopKCodecTest, DecodeAddScalesByAlpha) {
  const auto codec = Make({{"ratio", "1"}});
  TensorState state;
  const Encoded e = EncodeStep(*codec, {1, -2}, state, 0);
  std::vector<float> acc = {10, 10};
  ASSERT_TRUE(codec->DecodeAdd(e.payload, 0.5f, absl::MakeSpan(acc)).ok());
  EXPECT_EQ(acc, (std::vector<float>{10.5f, 9.0f}));
}

// A payload with `count` pairs whose gaps are written at width 32 in one
// block (so a test can say any gap), followed by `values` zero values.
Bytes Payload(uint64_t numel, std::vector<uint32_t> gaps, uint32_t count,
              size_t values) {
  char params[8] = {1};
  std::memcpy(params + 4, &count, 4);
  std::string body(1, static_cast<char>(32));
  body.append(reinterpret_cast<const char*>(gaps.data()), 4 * gaps.size());
  body.append(4 * values, '\0');
  WireHeader header;
  header.codec = CodecId::kTopK;
  header.numel = numel;
  Bytes out;
  WritePayload(header, absl::string_view(params, 8), body, &out);
  return out;
}

TEST(TopKCodecTest, DecodeRejectsBadPayloadsAndLeavesAccUntouched) {
  const auto codec = Make({});
  std::vector<float> acc(10, 1.0f);
  const std::vector<float> untouched = acc;
  struct Case {
    const char* what;
    Bytes payload;
  } cases[] = {
      {"index out of range", Payload(10, {2, 7}, 2, 2)},  // 2, 10
      {"count above numel", Payload(10, std::vector<uint32_t>(11), 11, 11)},
      {"count/body mismatch", Payload(10, {1, 2}, 3, 2)},
      {"missing values", Payload(10, {1, 2}, 2, 1)},
      {"extra values", Payload(10, {1, 2}, 2, 3)},
      {"wrong numel", Payload(11, {1}, 1, 1)},
  };
  for (const Case& c : cases) {
    const absl::Status status =
        codec->DecodeAdd(c.payload, 1.0f, absl::MakeSpan(acc));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.what;
    EXPECT_EQ(acc, untouched) << c.what;
  }
  Bytes bad_coding = Payload(10, {1}, 1, 1);
  bad_coding[kWireHeaderBytes] = 2;
  EXPECT_EQ(codec->DecodeAdd(bad_coding, 1.0f, absl::MakeSpan(acc)).code(),
            absl::StatusCode::kInvalidArgument);
  Bytes truncated = Payload(10, {1}, 1, 1);
  truncated.pop_back();
  EXPECT_EQ(codec->DecodeAdd(truncated, 1.0f, absl::MakeSpan(acc)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(acc, untouched);
  EXPECT_TRUE(
      codec->DecodeAdd(Payload(10, {0, 8}, 2, 2), 1.0f, absl::MakeSpan(acc))
          .ok());
}

TEST(TopKCodecTest, DecodeRejectsNonFiniteValuesAndLeavesAccUntouched) {
  const auto codec = Make({});
  const std::vector<uint32_t> indices = {2, 5, 9};
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    Bytes payload;
    WriteSparsePayload(CodecId::kTopK, 10, indices, {1.0f, bad, 2.0f},
                       &payload);
    std::vector<float> acc(10, 1.0f);
    const absl::Status status =
        codec->DecodeAdd(payload, 1.0f, absl::MakeSpan(acc));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(status.message().find("value 1 of 3 (at index 5)"),
              std::string::npos)
        << status;
    EXPECT_EQ(acc, std::vector<float>(10, 1.0f));
    std::vector<float> out(10, 7.0f);
    EXPECT_EQ(codec->FinishGather({payload}, StepContext(), absl::MakeSpan(out))
                  .code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(out, std::vector<float>(10, 7.0f));
  }
}

TEST(TopKCodecTest, FinishGatherIsTheBaseMeanOfTheDecodes) {
  const auto codec = Make({{"ratio", "0.05"}});
  std::vector<Bytes> payloads;
  for (uint32_t r = 0; r < 3; ++r) {
    TensorState state;
    payloads.push_back(
        EncodeStep(*codec, Normal(1000, 20 + r), state, 0).payload);
  }
  const std::vector<float> direct =
      testing::ExpectGatherMatchesTheDefault(*codec, payloads, 1000);
  EXPECT_GT(std::count(direct.begin(), direct.end(), 0.0f), 800);
}

// FinishGather writes the output a stretch at a time (8192 values): ranks'
// pairs that meet at one index, pairs on either side of a stretch's end, and
// a last stretch cut short all come out as the default's, bit for bit.
TEST(TopKCodecTest, FinishGatherAcrossStretchesIsTheBaseMean) {
  const auto codec = Make({{"ratio", "0.05"}, {"sample", "1"}});
  const size_t n = 3 * 8192 + 77;
  const std::vector<float> shared = Normal(n, 30);
  std::vector<Bytes> payloads;
  for (uint32_t r = 0; r < 4; ++r) {
    // Half of each rank's gradient is common, so their top k overlap.
    std::vector<float> g = Normal(n, 31 + r);
    for (size_t i = 0; i < n; ++i) g[i] = 0.5f * g[i] + shared[i];
    g[8191] = g[8192] = 100.0f + r;  // both sides of the first stretch's end
    g[n - 1] = -50.0f;               // the short last stretch
    TensorState state;
    payloads.push_back(EncodeStep(*codec, g, state, 0).payload);
  }
  const std::vector<float> direct =
      testing::ExpectGatherMatchesTheDefault(*codec, payloads, n);
  EXPECT_EQ(direct[8191], (100.0f + 101.0f + 102.0f + 103.0f) / 4);
  EXPECT_EQ(direct[n - 1], -50.0f);
  EXPECT_GT(std::count(direct.begin(), direct.end(), 0.0f), n / 2);
}

TEST(TopKCodecTest, FinishGatherWithABadPayloadLeavesOutputUntouched) {
  const auto codec = Make({});
  const std::vector<Bytes> payloads = {Payload(10, {1, 2}, 2, 2),
                                       Payload(10, {2, 7}, 2, 2)};  // 2, 10
  testing::ExpectGatherRefusedLikeTheDefault(*codec, payloads, 10,
                                             "topk: payload of rank 1: ");
}

TEST(TopKCodecTest, PayloadIsSmallerThanInt32Pairs) {
  const auto codec = Make({{"ratio", "0.001"}});
  TensorState state;
  const Encoded e = EncodeStep(*codec, Normal(1'000'000, 9), state, 0);
  const size_t pairs = e.indices.size();
  // Gaps average 1000: about 11 bits per index instead of 32.
  EXPECT_LT(e.payload.size(), kWireHeaderBytes + 8 + pairs * (4 + 2));
}

TEST(TopKCodecTest, CreateRejectsBadParameters) {
  for (const auto& [key, value] :
       std::vector<std::pair<std::string, std::string>>{
           {"ratio", "0"},
           {"ratio", "1.5"},
           {"sample", "0"},
           {"momentum", "1"},
           {"momentum", "-0.1"},
           {"clip_norm", "-1"},
           {"warmup_steps_per_stage", "-2"},
           {"ratoi", "0.1"}}) {
    const auto codec = TopKCodec::Create(CodecParams({{key, value}}));
    EXPECT_EQ(codec.status().code(), absl::StatusCode::kInvalidArgument)
        << key << "=" << value;
  }
}

TEST(TopKCodecTest, RegistersUnderItsName) {
  CodecRegistry registry;
  ASSERT_TRUE(RegisterTopK(registry).ok());
  const auto codec = registry.Create("topk", CodecParams({{"ratio", "0.1"}}));
  ASSERT_TRUE(codec.ok()) << codec.status();
  EXPECT_EQ((*codec)->info().id, CodecId::kTopK);
  EXPECT_TRUE((*codec)->info().stateful);
}

}  // namespace
}  // namespace gradcomp::codecs
