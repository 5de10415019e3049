#include "service/engine/engine.h"

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "codecs/builtin.h"
#include "codecs/state.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/collective/local_collective.h"
#include "service/metrics/metrics.h"
#include "service/metrics/metrics_testing.h"

namespace gradcomp::service {
namespace {

using ::testing::HasSubstr;

std::string FloatBytes(const std::vector<float>& values) {
  std::string out(values.size() * sizeof(float), '\0');
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

std::vector<float> BytesToFloats(const std::string& bytes) {
  std::vector<float> out(bytes.size() / sizeof(float));
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

// A smooth, non-trivial gradient: every value distinct, none zero.
std::vector<float> Ramp(size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    v[i] = std::sin(0.37f * static_cast<float>(i)) + 0.01f;
  }
  return v;
}

class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override { Build(EngineOptions(), Policy()); }

  void Build(const EngineOptions& options, const Policy& policy) {
    engine_.reset();
    auto engine = Engine::Create(options, codecs::BuiltinCodecs(), &store_,
                                 &collective_, &metrics_, policy);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(*engine);
  }

  // A 64 x 64 fp32 reduce of `values` (which must hold 4096 elements).
  ReduceInput Matrix(const std::string& data, int64_t step = 0) {
    ReduceInput in;
    in.job = "job";
    in.tensor = "fc1.weight";
    in.step = step;
    in.dtype = DType::kFloat32;
    in.shape = {64, 64};
    in.data = data;
    return in;
  }

  double Metric(absl::string_view name,
                const std::map<std::string, std::string>& labels = {}) {
    return MetricValue(*metrics_.collectable(), name, labels);
  }

  codecs::StateStore store_;
  Metrics metrics_{&store_, "test"};
  LocalCollective collective_;
  std::unique_ptr<Engine> engine_;
};

TEST_F(EngineTest, DenseReduceOfOneWorkerIsTheInput) {
  const std::vector<float> g = Ramp(4096);
  const std::string data = FloatBytes(g);
  auto out = engine_->Reduce(Matrix(data));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(BytesToFloats(out->data), g);
  const ReduceStats& s = out->stats;
  EXPECT_EQ(s.codec, "none");
  EXPECT_EQ(s.dense_reason, "default");
  EXPECT_EQ(s.raw_bytes, 4096u * 4);
  EXPECT_GT(s.wire_bytes, s.raw_bytes);  // the body plus a header
  EXPECT_EQ(s.relative_error, 0);
  EXPECT_EQ(s.world_size, 1);
  EXPECT_EQ(s.nonfinite_values, 0u);
  EXPECT_GE(s.total_seconds, s.encode_seconds);
}

TEST_F(EngineTest, TheSpecExampleMessageForAByteSizeMismatch) {
  const std::string data(1000, '\0');
  ReduceInput in = Matrix(data, 3);
  in.shape = {32, 32};
  auto out = engine_->Reduce(in);
  ASSERT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out.status().message(),
            "tensor 'fc1.weight' step 3: data has 1000 bytes, expected 4096 "
            "(shape [32,32] x float32)");
  EXPECT_EQ(Metric("gradcomp_reduce_total",
                   {{"codec", "unresolved"}, {"code", "INVALID_ARGUMENT"}}),
            1);
}

TEST_F(EngineTest, BadRequestsAreInvalidArgumentWithClearMessages) {
  const std::string data = FloatBytes(Ramp(4096));
  struct Case {
    std::string what;
    std::function<void(ReduceInput&)> mutate;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"empty name", [](ReduceInput& in) { in.tensor = ""; },
       "tensor name is empty"},
      {"negative step", [](ReduceInput& in) { in.step = -1; },
       "step is -1, expected >= 0"},
      {"long tensor name",
       [](ReduceInput& in) { in.tensor = std::string(1025, 't'); },
       "tensor name has 1025 bytes, expected at most 1024"},
      {"long job name",
       [](ReduceInput& in) { in.job = std::string(4 << 20, 'j'); },
       "job name has 4194304 bytes, expected at most 1024"},
      {"unknown dtype", [](ReduceInput& in) { in.dtype = DType(9); },
       "dtype is dtype(9), expected one of float32"},
      {"unspecified dtype",
       [](ReduceInput& in) { in.dtype = DType::kUnspecified; },
       "dtype is unspecified"},
      {"negative dim",
       [](ReduceInput& in) {
         in.shape = {64, -64};
       },
       "shape [64,-64]: dimension 1 is -64, expected >= 0"},
      {"unknown codec",
       [](ReduceInput& in) {
         in.codec = CodecSpec{"zip", {}};
       },
       "unknown codec 'zip' (known: "},
      {"bad codec param",
       [](ReduceInput& in) {
         in.codec = CodecSpec{"fp16", {{"bogus", "1"}}};
       },
       "bogus"},
  };
  for (const Case& c : cases) {
    ReduceInput in = Matrix(data);
    c.mutate(in);
    auto out = engine_->Reduce(in);
    EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument)
        << c.what;
    EXPECT_THAT(out.status().message(), HasSubstr(c.message)) << c.what;
  }
  // The daemon keeps serving after every one of them.
  EXPECT_TRUE(engine_->Reduce(Matrix(data)).ok());
  EXPECT_EQ(
      Metric("gradcomp_reduce_total", {{"codec", "none"}, {"code", "OK"}}), 1);
}

TEST_F(EngineTest, OversizedTensorsAreRefusedBeforeAnyAllocation) {
  EngineOptions options;
  options.max_tensor_bytes = 1 << 20;
  Build(options, Policy());
  const std::string data;
  ReduceInput in = Matrix(data);
  in.shape = {1 << 20, 1};  // 4 MiB of fp32
  auto out = engine_->Reduce(in);
  ASSERT_EQ(out.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(out.status().message(), HasSubstr("max_tensor_bytes 1048576"));

  // Dimensions whose product overflows 64 bits are caught the same way.
  in.shape = {int64_t{1} << 40, int64_t{1} << 40};
  EXPECT_EQ(engine_->Reduce(in).status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST_F(EngineTest, ZeroSizeTensorReturnsAnEmptyResult) {
  const std::string data;
  ReduceInput in = Matrix(data);
  in.shape = {0, 128};
  auto out = engine_->Reduce(in);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(out->data.empty());
  EXPECT_EQ(out->stats.dense_reason, "empty");
  EXPECT_EQ(out->stats.wire_bytes, 0u);
  EXPECT_TRUE(std::isnan(out->stats.relative_error));
}

TEST_F(EngineTest, ScalarIsOneElement) {
  const std::string data = FloatBytes({2.5f});
  ReduceInput in = Matrix(data);
  in.shape = {};
  auto out = engine_->Reduce(in);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(BytesToFloats(out->data), std::vector<float>{2.5f});
  EXPECT_EQ(out->stats.dense_reason, "small");
}

TEST_F(EngineTest, DenseCodecsPassNanAndInfThrough) {
  std::vector<float> g = Ramp(4096);
  g[7] = std::numeric_limits<float>::quiet_NaN();
  g[100] = -std::numeric_limits<float>::infinity();
  const std::string data = FloatBytes(g);
  for (const std::string codec : {"none", "fp16", "bf16"}) {
    ReduceInput in = Matrix(data);
    in.codec = CodecSpec{codec, {}};
    auto out = engine_->Reduce(in);
    ASSERT_TRUE(out.ok()) << codec << ": " << out.status();
    const std::vector<float> result = BytesToFloats(out->data);
    EXPECT_TRUE(std::isnan(result[7])) << codec;
    EXPECT_EQ(result[100], -std::numeric_limits<float>::infinity()) << codec;
    EXPECT_EQ(out->stats.nonfinite_values, 2u);
    EXPECT_TRUE(std::isnan(out->stats.relative_error));
  }
  EXPECT_EQ(Metric("gradcomp_nonfinite_values_total"), 6);
}

TEST_F(EngineTest, CompressingCodecsRejectNanWithCountAndFirstIndex) {
  std::vector<float> g = Ramp(4096);
  g[42] = std::numeric_limits<float>::quiet_NaN();
  g[43] = std::numeric_limits<float>::infinity();
  const std::string data = FloatBytes(g);
  ReduceInput in = Matrix(data);
  in.codec = CodecSpec{"topk", {{"ratio", "0.01"}}};
  auto out = engine_->Reduce(in);
  ASSERT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(out.status().message(),
              HasSubstr("2 NaN/Inf values (first at index 42"));
  EXPECT_THAT(out.status().message(), HasSubstr("codec 'topk'"));
  EXPECT_EQ(Metric("gradcomp_nonfinite_values_total"), 2);
  EXPECT_EQ(Metric("gradcomp_reduce_total",
                   {{"codec", "topk"}, {"code", "INVALID_ARGUMENT"}}),
            1);
  // Nothing reached the codec's state: a clean step afterwards still works.
  EXPECT_TRUE(engine_->Reduce(Matrix(FloatBytes(Ramp(4096)))).ok());
}

// The count reads exponent bits four lanes at a time, then the ragged tail:
// every kind of NaN and Inf counts, in any lane and in the tail, and no
// finite value does (largest, subnormal, negative zero).
TEST_F(EngineTest, NonfiniteCountCoversEveryLaneAndTheTail) {
  const auto bits = [](uint32_t b) {
    float f;
    std::memcpy(&f, &b, sizeof(f));
    return f;
  };
  std::vector<float> g = Ramp(4099);
  g[0] = std::numeric_limits<float>::max();
  g[1] = std::numeric_limits<float>::denorm_min();
  g[2] = -0.0f;
  g[3] = -std::numeric_limits<float>::max();
  g[5] = bits(0xffc00001u);     // negative quiet NaN with a payload
  g[2050] = bits(0x7f800001u);  // signalling NaN
  g[4095] = std::numeric_limits<float>::infinity();
  g[4098] = -std::numeric_limits<float>::infinity();  // in the tail
  ReduceInput in = Matrix(FloatBytes(g));
  in.shape = {4099};
  in.codec = CodecSpec{"topk", {{"ratio", "0.01"}}};
  auto out = engine_->Reduce(in);
  ASSERT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(out.status().message(),
              HasSubstr("4 NaN/Inf values (first at index 5: "));
  EXPECT_EQ(Metric("gradcomp_nonfinite_values_total"), 4);
}

TEST_F(EngineTest, HalfAndDoubleInputsComeBackInTheirOwnDType) {
  // Values exact in every dtype, so a dense round trip is exact.
  std::vector<float> g(4096);
  for (size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>(i % 64) - 32;
  for (DType dtype : {DType::kFloat16, DType::kBFloat16, DType::kFloat64}) {
    absl::StatusOr<std::string> data = EncodeFromFloat(dtype, g);
    ASSERT_TRUE(data.ok());
    ReduceInput in = Matrix(*data);
    in.dtype = dtype;
    auto out = engine_->Reduce(in);
    ASSERT_TRUE(out.ok()) << DTypeName(dtype) << ": " << out.status();
    EXPECT_EQ(out->data, *data) << DTypeName(dtype);
    EXPECT_EQ(out->stats.raw_bytes, 4096u * 4);  // codecs compute in fp32
  }
}

TEST_F(EngineTest, RelativeErrorIsThatOfTheDecodedPayload) {
  // 4099 values: the vectorised sum's tail (numel % 8 = 3) counts too. One
  // worker at step 0 (no residual yet): the average is the decoded payload.
  const std::vector<float> g = Ramp(4099);
  const std::string data = FloatBytes(g);
  ReduceInput in = Matrix(data);
  in.shape = {4099};
  in.codec = CodecSpec{"topk", {{"ratio", "0.1"}}};
  auto out = engine_->Reduce(in);
  ASSERT_TRUE(out.ok()) << out.status();
  const std::vector<float> average = BytesToFloats(out->data);
  double diff = 0, norm = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    diff += (static_cast<double>(g[i]) - average[i]) *
            (static_cast<double>(g[i]) - average[i]);
    norm += static_cast<double>(g[i]) * g[i];
  }
  EXPECT_GT(out->stats.relative_error, 0.1);
  EXPECT_NEAR(out->stats.relative_error, std::sqrt(diff / norm), 1e-12);
}

// A LocalCollective whose next Run fails, as a collective does that lost a
// peer.
class LosesAPeerOnce : public LocalCollective {
 public:
  void FailNextRun() { fail_ = true; }
  absl::StatusOr<codecs::RoundResult> Run(const RoundKey& key,
                                          codecs::Round round) override {
    if (std::exchange(fail_, false)) {
      return absl::UnavailableError("lost peer rank 1");
    }
    return LocalCollective::Run(key, std::move(round));
  }

 private:
  bool fail_ = false;
};

// Steps 0-2 of a 64x64 tensor under `codec`; `before_step1`, when set,
// runs just before step 1's reduce (a failing attempt of the step).
// Returns the averages of steps 1 and 2.
std::vector<std::vector<float>> AveragesOfSteps1And2(
    const CodecSpec& codec,
    const std::function<void(Engine&, LosesAPeerOnce&, const ReduceInput&)>&
        before_step1) {
  codecs::StateStore store;
  Metrics metrics(&store, "test");
  LosesAPeerOnce collective;
  auto engine = Engine::Create(EngineOptions(), codecs::BuiltinCodecs(), &store,
                               &collective, &metrics, Policy());
  EXPECT_TRUE(engine.ok()) << engine.status();
  std::vector<std::vector<float>> averages;
  for (int64_t step = 0; step < 3; ++step) {
    std::vector<float> g(4096);
    for (size_t i = 0; i < g.size(); ++i) {
      g[i] = std::sin(0.37f * static_cast<float>(i) + step) + 0.01f;
    }
    const std::string data = FloatBytes(g);
    ReduceInput in;
    in.job = "job";
    in.tensor = "fc1.weight";
    in.step = step;
    in.shape = {64, 64};
    in.data = data;
    in.codec = codec;
    if (step == 1 && before_step1) before_step1(**engine, collective, in);
    absl::StatusOr<ReduceOutput> out = (*engine)->Reduce(in);
    EXPECT_TRUE(out.ok()) << out.status();
    if (out.ok() && step > 0) averages.push_back(BytesToFloats(out->data));
  }
  return averages;
}

void ExpectSameAverages(const std::vector<std::vector<float>>& rerun,
                        const std::vector<std::vector<float>>& clean) {
  ASSERT_EQ(clean.size(), 2u);
  ASSERT_EQ(rerun.size(), 2u);
  for (size_t s = 0; s < clean.size(); ++s) {
    for (size_t i = 0; i < clean[s].size(); ++i) {
      ASSERT_NEAR(rerun[s][i], clean[s][i], 1e-5)
          << "step " << s + 1 << " [" << i << "]";
    }
  }
}

// A step whose collective fails leaves the codec state as it was, so that
// the trainer's rerun of the step, and the steps after it, give what they
// give without the failure (to within the rounding of the give-back).
TEST(EngineFailedStepTest, TheRerunOfAStepWhoseCollectiveFailedIsExact) {
  for (const CodecSpec& codec :
       {CodecSpec{"efsign", {}}, CodecSpec{"topk", {{"ratio", "0.01"}}}}) {
    SCOPED_TRACE(codec.name);
    ExpectSameAverages(
        AveragesOfSteps1And2(
            codec,
            [](Engine& engine, LosesAPeerOnce& collective,
               const ReduceInput& in) {
              collective.FailNextRun();
              EXPECT_TRUE(absl::IsUnavailable(engine.Reduce(in).status()));
            }),
        AveragesOfSteps1And2(codec, nullptr));
  }
}

// A bad request that resets the tensor's state (a wrong shape, another
// compressing codec) and then fails, as it does when the other ranks send
// the right one, gives the state back: the rerun of the step with the
// right request is exact. Before, the reset stuck and the tensor's
// residuals and momenta were lost to one bad request.
TEST(EngineFailedStepTest, AFailedRequestThatResetTheStateGivesItBack) {
  const CodecSpec topk{"topk", {{"ratio", "0.01"}}};
  for (const bool wrong_shape : {true, false}) {
    SCOPED_TRACE(wrong_shape ? "a wrong shape" : "another codec");
    ExpectSameAverages(
        AveragesOfSteps1And2(
            topk,
            [&](Engine& engine, LosesAPeerOnce& collective,
                const ReduceInput& in) {
              ReduceInput bad = in;
              if (wrong_shape) {
                bad.shape = {4096};
              } else {
                bad.codec = CodecSpec{"efsign", {}};
              }
              collective.FailNextRun();
              EXPECT_TRUE(absl::IsUnavailable(engine.Reduce(bad).status()));
            }),
        AveragesOfSteps1And2(topk, nullptr));
  }
}

TEST_F(EngineTest, OutputSpanReceivesTheAverageInTheRequestDType) {
  std::vector<float> g(4096);
  for (size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>(i % 64) - 32;
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kFloat64}) {
    absl::StatusOr<std::string> data = EncodeFromFloat(dtype, g);
    ASSERT_TRUE(data.ok());
    // One spare byte on each side: the engine writes exactly the span.
    std::string buffer(data->size() + 2, 'x');
    ReduceInput in = Matrix(*data);
    in.dtype = dtype;
    in.output = absl::MakeSpan(buffer.data() + 1, data->size());
    auto out = engine_->Reduce(in);
    ASSERT_TRUE(out.ok()) << DTypeName(dtype) << ": " << out.status();
    EXPECT_TRUE(out->data.empty()) << DTypeName(dtype);
    EXPECT_EQ(buffer.substr(1, data->size()), *data) << DTypeName(dtype);
    EXPECT_EQ(buffer.front(), 'x');
    EXPECT_EQ(buffer.back(), 'x');
  }
}

TEST_F(EngineTest, UnalignedFloat32InputAndOutputAreCopiedNotMisread) {
  const std::vector<float> g = Ramp(4096);
  // The bytes start one past an aligned address: not readable as floats.
  const std::string padded = "x" + FloatBytes(g);
  const absl::string_view data = absl::string_view(padded).substr(1);
  std::string buffer(data.size() + 1, 'x');
  ReduceInput in = Matrix(std::string(), 0);
  in.data = data;
  in.output = absl::MakeSpan(buffer.data() + 1, data.size());
  in.codec = CodecSpec{"topk", {{"ratio", "0.01"}}};
  auto unaligned = engine_->Reduce(in);
  ASSERT_TRUE(unaligned.ok()) << unaligned.status();

  codecs::StateStore other_store;
  Metrics other_metrics(&other_store, "test");
  auto other =
      Engine::Create(EngineOptions(), codecs::BuiltinCodecs(), &other_store,
                     &collective_, &other_metrics, Policy());
  ASSERT_TRUE(other.ok());
  const std::string aligned = FloatBytes(g);
  ReduceInput same = Matrix(aligned, 0);
  same.codec = in.codec;
  auto expected = (*other)->Reduce(same);
  ASSERT_TRUE(expected.ok()) << expected.status();
  EXPECT_EQ(buffer.substr(1), expected->data);
  EXPECT_EQ(unaligned->stats.relative_error, expected->stats.relative_error);
}

// Counts the rounds that reach the collective.
class CountingCollective : public LocalCollective {
 public:
  absl::StatusOr<codecs::RoundResult> Run(const RoundKey& key,
                                          codecs::Round round) override {
    ++runs;
    return LocalCollective::Run(key, std::move(round));
  }
  int runs = 0;
};

TEST_F(EngineTest, OutputSpanOfTheWrongSizeIsRefusedBeforeAnyCollective) {
  CountingCollective counting;
  auto engine = Engine::Create(EngineOptions(), codecs::BuiltinCodecs(),
                               &store_, &counting, &metrics_, Policy());
  ASSERT_TRUE(engine.ok()) << engine.status();
  const std::string data = FloatBytes(Ramp(4096));
  std::string buffer(4096 * 4 - 4, 'x');
  ReduceInput in = Matrix(data, 5);
  in.output = absl::MakeSpan(buffer.data(), buffer.size());
  auto out = (*engine)->Reduce(in);
  ASSERT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out.status().message(),
            "tensor 'fc1.weight' step 5: output buffer has 16380 bytes, "
            "expected 16384 (shape [64,64] x float32)");
  EXPECT_EQ(counting.runs, 0);
  EXPECT_EQ(buffer, std::string(4096 * 4 - 4, 'x'));

  std::string right(4096 * 4, 'x');
  in.output = absl::MakeSpan(right.data(), right.size());
  ASSERT_TRUE((*engine)->Reduce(in).ok());
  EXPECT_EQ(counting.runs, 1);
  EXPECT_EQ(right, data);
}

TEST_F(EngineTest, PolicyDecidesAndRequestOverrideWins) {
  Policy policy;
  policy.warmup_steps = 2;
  PolicyRule rule;
  rule.name_glob = "*.weight";
  rule.codec = {"fp16", {}};
  policy.rules.push_back(rule);
  Build(EngineOptions(), policy);
  const std::string data = FloatBytes(Ramp(4096));

  auto warm = engine_->Reduce(Matrix(data, 1));
  ASSERT_TRUE(warm.ok());
  EXPECT_EQ(warm->stats.codec, "none");
  EXPECT_EQ(warm->stats.dense_reason, "warmup");

  auto ruled = engine_->Reduce(Matrix(data, 2));
  ASSERT_TRUE(ruled.ok());
  EXPECT_EQ(ruled->stats.codec, "fp16");
  EXPECT_EQ(ruled->stats.dense_reason, "");
  EXPECT_LT(ruled->stats.wire_bytes, ruled->stats.raw_bytes);
  EXPECT_GT(ruled->stats.relative_error, 0);
  EXPECT_LT(ruled->stats.relative_error, 1e-3);

  ReduceInput in = Matrix(data, 2);
  in.codec = CodecSpec{"bf16", {}};
  auto overridden = engine_->Reduce(in);
  ASSERT_TRUE(overridden.ok());
  EXPECT_EQ(overridden->stats.codec, "bf16");

  const std::string bias = FloatBytes(Ramp(4096));
  ReduceInput one_d = Matrix(bias, 5);
  one_d.tensor = "fc1.bias";
  one_d.shape = {4096};
  auto dense = engine_->Reduce(one_d);
  ASSERT_TRUE(dense.ok());
  EXPECT_EQ(dense->stats.dense_reason, "1-d");

  EXPECT_EQ(Metric("gradcomp_dense_total", {{"reason", "warmup"}}), 1);
  EXPECT_EQ(Metric("gradcomp_dense_total", {{"reason", "1-d"}}), 1);
  EXPECT_EQ(Metric("gradcomp_raw_bytes_total", {{"codec", "fp16"}}), 4096 * 4);
  EXPECT_EQ(Metric("gradcomp_compression_relative_error", {{"codec", "fp16"}}),
            1);
  EXPECT_EQ(Metric("gradcomp_stage_duration_seconds", {{"stage", "total"}}), 4);
}

// DGC's density stages start where the policy's dense warm-up ends: at
// step 4, after 4 dense steps, top-k sends its first stage's 25 % (1024 of
// 4096 values), not the third stage's 1.56 % it would send counting from
// step 0, a drop from dense to 1.56 % in one step.
TEST_F(EngineTest, TopKWarmupStagesStartAfterThePolicysDenseWarmup) {
  Policy policy;
  policy.warmup_steps = 4;
  policy.default_codec = {
      "topk", {{"ratio", "0.001"}, {"warmup_steps_per_stage", "2"}}};
  Build(EngineOptions(), policy);
  const std::string data = FloatBytes(Ramp(4096));
  auto dense = engine_->Reduce(Matrix(data, 3));
  ASSERT_TRUE(dense.ok()) << dense.status();
  EXPECT_EQ(dense->stats.dense_reason, "warmup");
  auto first = engine_->Reduce(Matrix(data, 4));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->stats.codec, "topk");
  // 1024 fp32 values alone; 64 values and their indices fit in 512 bytes.
  EXPECT_GT(first->stats.wire_bytes, 1024u * 4);
  auto third = engine_->Reduce(Matrix(data, 8));
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_LT(third->stats.wire_bytes, 1024u);
}

// A tensor that moves from topk to qsgd drops topk's momenta (3 x 4096
// floats) instead of holding them; a dense step between keeps them.
TEST_F(EngineTest, AnotherCompressingCodecDropsTheStateADenseStepKeeps) {
  const std::string data = FloatBytes(Ramp(4096));
  const auto reduce = [&](int64_t step, const std::string& codec) {
    ReduceInput in = Matrix(data, step);
    in.codec = CodecSpec{codec, {}};
    absl::StatusOr<ReduceOutput> out = engine_->Reduce(in);
    ASSERT_TRUE(out.ok()) << codec << ": " << out.status();
    EXPECT_EQ(out->stats.codec, codec);
  };
  const std::vector<std::string> tensor = {"fc1.weight"};
  reduce(0, "topk");
  const size_t topk_bytes = store_.ByteSizeOf("job", tensor);
  EXPECT_GE(topk_bytes, 2u * 4096 * 4);
  reduce(1, "none");
  EXPECT_EQ(store_.ByteSizeOf("job", tensor), topk_bytes);
  reduce(2, "qsgd");
  EXPECT_EQ(store_.ByteSizeOf("job", tensor), 0u);
  EXPECT_EQ(Metric("gradcomp_state_resets_total"), 1);
}

TEST_F(EngineTest, SetPolicyValidatesBeforeSwapping) {
  const std::string before = engine_->policy()->hash;
  Policy bad;
  bad.default_codec = {"zip", {}};
  auto rejected = engine_->SetPolicy(bad);
  ASSERT_EQ(rejected.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(rejected.status().message(), HasSubstr("default_codec"));
  EXPECT_EQ(engine_->policy()->hash, before);

  Policy good;
  good.default_codec = {"bf16", {}};
  auto hash = engine_->SetPolicy(good);
  ASSERT_TRUE(hash.ok()) << hash.status();
  EXPECT_NE(*hash, before);
  EXPECT_EQ(engine_->policy()->hash, *hash);
  auto out = engine_->Reduce(Matrix(FloatBytes(Ramp(4096))));
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->stats.codec, "bf16");
}

TEST_F(EngineTest, CreateRejectsBadOptionsAndPolicies) {
  EngineOptions options;
  options.error_sample_rate = 1.5;
  auto engine = Engine::Create(options, codecs::BuiltinCodecs(), &store_,
                               &collective_, &metrics_, Policy());
  ASSERT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(engine.status().message(), HasSubstr("error_sample_rate is 1.5"));

  Policy bad;
  bad.default_codec = {"zip", {}};
  EXPECT_FALSE(Engine::Create(EngineOptions(), codecs::BuiltinCodecs(), &store_,
                              &collective_, &metrics_, bad)
                   .ok());
}

TEST_F(EngineTest, ErrorSampleRateMeasuresThatFraction) {
  EngineOptions options;
  options.error_sample_rate = 0.25;
  Build(options, Policy());
  const std::string data = FloatBytes(Ramp(4096));
  std::vector<int> measured;
  for (int step = 0; step < 8; ++step) {
    auto out = engine_->Reduce(Matrix(data, step));
    ASSERT_TRUE(out.ok());
    if (!std::isnan(out->stats.relative_error)) measured.push_back(step);
  }
  // Every fourth, starting with the first.
  EXPECT_EQ(measured, std::vector<int>({0, 4}));
}

TEST_F(EngineTest, ResidualNormIsObservedForCodecsThatKeepOne) {
  const std::string data = FloatBytes(Ramp(4096));
  for (int step = 0; step < 3; ++step) {
    ReduceInput in = Matrix(data, step);
    in.codec = CodecSpec{"topk", {{"ratio", "0.01"}}};
    ASSERT_TRUE(engine_->Reduce(in).ok());
    in.tensor = "fc2.weight";
    in.codec = CodecSpec{"none", {}};
    ASSERT_TRUE(engine_->Reduce(in).ok());
  }
  EXPECT_EQ(Metric("gradcomp_residual_relative_norm", {{"codec", "topk"}}), 3);
  EXPECT_EQ(Metric("gradcomp_residual_relative_norm", {{"codec", "none"}}), 0);
}

TEST_F(EngineTest, DeclaredJobsAcceptOnlyTheirTensors) {
  const std::string data = FloatBytes(Ramp(4096));
  ReduceInput other = Matrix(data);
  other.tensor = "fc2.weight";
  ASSERT_TRUE(engine_->Reduce(other).ok());  // nothing declared yet

  auto hash = engine_->DeclareTensors(
      "job", 0, {{"fc1.weight", DType::kFloat32, {64, 64}}});
  ASSERT_TRUE(hash.ok()) << hash.status();
  EXPECT_EQ(hash->size(), 16u);
  EXPECT_TRUE(engine_->Reduce(Matrix(data)).ok());
  auto out = engine_->Reduce(other);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(out.status().message()),
              HasSubstr("'fc2.weight' is not in job 'job''s declared list"));
  ReduceInput transposed = Matrix(data);
  transposed.shape = {4096};
  EXPECT_THAT(std::string(engine_->Reduce(transposed).status().message()),
              HasSubstr("expected float32 [64,64] as declared"));
  other.job = "another-job";
  EXPECT_TRUE(engine_->Reduce(other).ok());
}

TEST_F(EngineTest, DeclarationsAndNamesMayNotUseTheReservedHash) {
  EXPECT_EQ(engine_->DeclareTensors("job", 0, {{"a#b", DType::kFloat32, {1}}})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine_->DeclareTensors("job", -1, {{"a", DType::kFloat32, {1}}})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  const std::string data = FloatBytes(Ramp(4096));
  ReduceInput in = Matrix(data);
  in.tensor = "fc1.weight#slice0";
  EXPECT_THAT(std::string(engine_->Reduce(in).status().message()),
              HasSubstr("holds '#'"));
}

TEST_F(EngineTest, StateExportAndImportRoundTrip) {
  const std::string data = FloatBytes(Ramp(4096));
  ReduceInput in = Matrix(data);
  in.codec = CodecSpec{"topk", {{"ratio", "0.01"}}};
  auto first = engine_->Reduce(in);
  ASSERT_TRUE(first.ok()) << first.status();
  auto blob = engine_->ExportState("job");
  ASSERT_TRUE(blob.ok()) << blob.status();

  // A fresh daemon with the imported state continues exactly as this one.
  codecs::StateStore other_store;
  Metrics other_metrics(&other_store, "test");
  auto other =
      Engine::Create(EngineOptions(), codecs::BuiltinCodecs(), &other_store,
                     &collective_, &other_metrics, Policy());
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE((*other)->ImportState("job", *blob).ok());
  EXPECT_GT(other_store.ByteSize(), 0u);
  in.step = 1;
  auto here = engine_->Reduce(in);
  auto there = (*other)->Reduce(in);
  ASSERT_TRUE(here.ok() && there.ok());
  EXPECT_EQ(here->data, there->data);

  EXPECT_EQ(engine_->ImportState("job", "garbage").code(),
            absl::StatusCode::kInvalidArgument);
}

// Imported state counts against the memory budget and the job's quotas as
// the reduces that made it would have: too large an import is refused
// whole, before it replaces anything.
TEST_F(EngineTest, ImportedStateCountsAgainstTheBudgetAndQuotas) {
  const std::string data = FloatBytes(Ramp(4096));
  ReduceInput in = Matrix(data);
  in.codec = CodecSpec{"topk", {{"ratio", "0.01"}}};
  ASSERT_TRUE(engine_->Reduce(in).ok());
  auto blob = engine_->ExportState("job");
  ASSERT_TRUE(blob.ok()) << blob.status();
  const uint64_t state = store_.ByteSize();
  ASSERT_GT(state, 0u);

  auto fresh = [&](EngineOptions options, codecs::StateStore* store,
                   Metrics* metrics) {
    auto engine = Engine::Create(options, codecs::BuiltinCodecs(), store,
                                 &collective_, metrics, Policy());
    EXPECT_TRUE(engine.ok()) << engine.status();
    return std::move(*engine);
  };
  codecs::StateStore small_store;
  Metrics small_metrics(&small_store, "test");
  EngineOptions small;
  small.memory_budget_bytes = state - 1;
  auto tight = fresh(small, &small_store, &small_metrics);
  absl::Status refused = tight->ImportState("job", *blob);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(),
              HasSubstr("memory budget: the state imported into job 'job'"));
  EXPECT_EQ(small_store.ByteSize(), 0u);

  codecs::StateStore quota_store;
  Metrics quota_metrics(&quota_store, "test");
  EngineOptions quota;
  quota.quotas.max_state_bytes_per_job = state - 1;
  auto capped = fresh(quota, &quota_store, &quota_metrics);
  EXPECT_THAT(capped->ImportState("job", *blob).message(),
              HasSubstr("max_state_bytes_per_job"));
  EXPECT_EQ(quota_store.ByteSize(), 0u);

  codecs::StateStore roomy_store;
  Metrics roomy_metrics(&roomy_store, "test");
  auto roomy = fresh(EngineOptions(), &roomy_store, &roomy_metrics);
  ASSERT_TRUE(roomy->ImportState("job", *blob).ok());
  EXPECT_EQ(MetricValue(*roomy_metrics.collectable(),
                        "gradcomp_memory_budget_in_use_bytes"),
            static_cast<double>(state));
  // Imported again over itself: no change.
  ASSERT_TRUE(roomy->ImportState("job", *blob).ok());
  EXPECT_EQ(MetricValue(*roomy_metrics.collectable(),
                        "gradcomp_memory_budget_in_use_bytes"),
            static_cast<double>(state));
}

// ReleaseJob frees a job's codec state (back to the memory budget) and its
// declared list, leaves other jobs alone, and the job's next reduce starts
// afresh: it returns what a new daemon's first reduce returns.
TEST_F(EngineTest, ReleaseJobFreesItsStateAndItsNextReduceStartsAfresh) {
  const std::string data = FloatBytes(Ramp(4096));
  ReduceInput in = Matrix(data);
  in.codec = CodecSpec{"topk", {{"ratio", "0.01"}}};
  absl::StatusOr<ReduceOutput> first = engine_->Reduce(in);
  ASSERT_TRUE(first.ok()) << first.status();
  const uint64_t state = store_.ByteSize();
  ASSERT_GT(state, 0u);
  ReduceInput other = in;
  other.job = "job2";
  ASSERT_TRUE(engine_->Reduce(other).ok());
  ASSERT_TRUE(engine_
                  ->DeclareTensors("job", 0,
                                   {{"fc1.weight", DType::kFloat32, {64, 64}}})
                  .ok());
  ASSERT_EQ(Metric("gradcomp_memory_budget_in_use_bytes"), 2.0 * state);

  absl::StatusOr<ReleasedJob> released = engine_->ReleaseJob("job");
  ASSERT_TRUE(released.ok()) << released.status();
  EXPECT_EQ(released->tensors, 1u);
  EXPECT_EQ(released->state_bytes, state);
  EXPECT_EQ(store_.ByteSize(), state);  // job2's
  EXPECT_EQ(Metric("gradcomp_memory_budget_in_use_bytes"), 1.0 * state);
  EXPECT_EQ(Metric("gradcomp_jobs_released_total"), 1);
  EXPECT_EQ(engine_->ExportState("job").value(),
            engine_->ExportState("never-seen").value());

  // Its first step again, with no residual left: as the first time.
  absl::StatusOr<ReduceOutput> again = engine_->Reduce(in);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->data, first->data);
  // The declared list went too: another tensor name is accepted.
  ReduceInput undeclared = Matrix(data);
  undeclared.tensor = "fc2.weight";
  EXPECT_TRUE(engine_->Reduce(undeclared).ok());

  absl::StatusOr<ReleasedJob> unknown = engine_->ReleaseJob("never-seen");
  ASSERT_TRUE(unknown.ok()) << unknown.status();
  EXPECT_EQ(unknown->tensors, 0u);
  EXPECT_EQ(unknown->state_bytes, 0u);
}

// The state store keys a tensor by job + NUL + tensor: a job name holding
// a NUL would reach into another job's state, so every call refuses it.
TEST_F(EngineTest, JobNamesWithANulAreRefused) {
  const std::string data = FloatBytes(Ramp(4096));
  ReduceInput in = Matrix(data);
  in.codec = CodecSpec{"topk", {{"ratio", "0.01"}}};
  ASSERT_TRUE(engine_->Reduce(in).ok());
  const std::string nul_job("job\0fc1", 7);
  in.job = nul_job;
  EXPECT_THAT(engine_->Reduce(in).status().message(), HasSubstr("NUL"));
  EXPECT_EQ(engine_->ExportState(nul_job).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine_->ImportState(nul_job, "").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine_->ReleaseJob(nul_job).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine_->DeclareTensors(nul_job, 0, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_GT(store_.ByteSize(), 0u);
}

}  // namespace
}  // namespace gradcomp::service
