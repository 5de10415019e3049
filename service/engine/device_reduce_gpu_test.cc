// The engine's GPU path (device_codecs.h): four in-process ranks reduce
// tensors held in device memory, and the averages must be the host path's
// bits for every codec with a GPU twin (run there, backend "cuda") and for
// one without (staged through the host, backend "cpu"). Skips
// (GTEST_SKIP) where no GPU answers.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "codecs/builtin.h"
#include "codecs/cpu/momentum.h"
#include "codecs/state.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/collective/in_process_group.h"
#include "service/collective/local_collective.h"
#include "service/engine/device_codecs.h"
#include "service/engine/engine.h"
#include "service/metrics/metrics.h"
#include "service/metrics/metrics_testing.h"

namespace gradcomp::service {
namespace {

constexpr int kWorld = 4;
constexpr int kSteps = 3;
constexpr int64_t kNumel = 10007;  // odd: a partial bucket and Philox block

struct Case {
  std::string codec;
  std::map<std::string, std::string> params;
  std::string backend;  // where the daemon runs it
  // Empty: 1-D. onebit reads shape[0] (its columns), so it runs as a matrix.
  std::vector<int64_t> shape = {};
};

// Ranks of one job: an engine, state and metrics each.
class Ranks {
 public:
  Ranks() : group_(kWorld, absl::Seconds(30)) {
    for (int r = 0; r < kWorld; ++r) {
      stores_.push_back(std::make_unique<codecs::StateStore>());
      metrics_.push_back(std::make_unique<Metrics>(stores_.back().get(), "t"));
      EngineOptions options;
      options.seed = 11;
      auto engine =
          Engine::Create(options, codecs::BuiltinCodecs(), stores_[r].get(),
                         &group_.collective(r), metrics_[r].get(), Policy());
      EXPECT_TRUE(engine.ok()) << engine.status();
      engines_.push_back(std::move(*engine));
    }
  }
  Engine& engine(int r) { return *engines_[r]; }
  Metrics& metrics(int r) { return *metrics_[r]; }

 private:
  InProcessGroup group_;
  std::vector<std::unique_ptr<codecs::StateStore>> stores_;
  std::vector<std::unique_ptr<Metrics>> metrics_;
  std::vector<std::unique_ptr<Engine>> engines_;
};

std::vector<float> Gradient(int rank, int step) {
  std::mt19937 rng(1000 * rank + step);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> g(kNumel);
  for (float& v : g) v = normal(rng);
  return g;
}

ReduceInput Input(const Case& c, int step) {
  ReduceInput in;
  in.job = "job";
  in.tensor = "w";
  in.step = step;
  in.shape = c.shape.empty() ? std::vector<int64_t>{kNumel} : c.shape;
  in.codec = CodecSpec{c.codec, c.params};
  return in;
}

// Every rank's average of every step, through the host path.
std::vector<std::vector<float>> HostAverages(const Case& c) {
  Ranks ranks;
  std::vector<std::vector<float>> out(kWorld * kSteps);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      for (int s = 0; s < kSteps; ++s) {
        const std::vector<float> g = Gradient(r, s);
        ReduceInput in = Input(c, s);
        in.data = {reinterpret_cast<const char*>(g.data()),
                   g.size() * sizeof(float)};
        absl::StatusOr<ReduceOutput> reduced = ranks.engine(r).Reduce(in);
        ASSERT_TRUE(reduced.ok()) << "rank " << r << ": " << reduced.status();
        EXPECT_EQ(reduced->stats.backend, "cpu");
        std::vector<float>& avg = out[r * kSteps + s];
        avg.resize(kNumel);
        std::memcpy(avg.data(), reduced->data.data(), reduced->data.size());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return out;
}

// The same through device memory; checks the backend each reduce reports
// and counts.
std::vector<std::vector<float>> DeviceAverages(const Case& c) {
  Ranks ranks;
  std::vector<std::vector<float>> out(kWorld * kSteps);
  std::vector<std::thread> threads;
  const size_t bytes = kNumel * sizeof(float);
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
      void* d_in = nullptr;
      void* d_out = nullptr;
      ASSERT_EQ(cudaMalloc(&d_in, bytes), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&d_out, bytes), cudaSuccess);
      for (int s = 0; s < kSteps; ++s) {
        const std::vector<float> g = Gradient(r, s);
        ASSERT_EQ(cudaMemcpy(d_in, g.data(), bytes, cudaMemcpyHostToDevice),
                  cudaSuccess);
        const DeviceTensor device{0, d_in, d_out, bytes};
        ReduceInput in = Input(c, s);
        in.device = &device;
        absl::StatusOr<ReduceOutput> reduced = ranks.engine(r).Reduce(in);
        ASSERT_TRUE(reduced.ok()) << "rank " << r << ": " << reduced.status();
        EXPECT_EQ(reduced->stats.backend, c.backend);
        EXPECT_TRUE(reduced->data.empty());
        std::vector<float>& avg = out[r * kSteps + s];
        avg.resize(kNumel);
        ASSERT_EQ(cudaMemcpy(avg.data(), d_out, bytes, cudaMemcpyDeviceToHost),
                  cudaSuccess);
        // The input is read, never written.
        std::vector<float> back(kNumel);
        ASSERT_EQ(cudaMemcpy(back.data(), d_in, bytes, cudaMemcpyDeviceToHost),
                  cudaSuccess);
        EXPECT_EQ(std::memcmp(back.data(), g.data(), bytes), 0);
      }
      cudaFree(d_in);
      cudaFree(d_out);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(MetricValue(*ranks.metrics(r).collectable(),
                          "gradcomp_reduce_backend_total",
                          {{"codec", c.codec}, {"backend", c.backend}}),
              kSteps)
        << "rank " << r;
  }
  return out;
}

class DeviceReduceTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
      GTEST_SKIP() << "no usable CUDA device";
    }
  }
};

TEST_P(DeviceReduceTest, EqualsTheHostPathBitForBit) {
  const Case& c = GetParam();
  const std::vector<std::vector<float>> host = HostAverages(c);
  const std::vector<std::vector<float>> device = DeviceAverages(c);
  for (int i = 0; i < kWorld * kSteps; ++i) {
    ASSERT_EQ(device[i].size(), host[i].size());
    size_t differ = 0;
    for (size_t j = 0; j < host[i].size(); ++j) {
      if (std::memcmp(&device[i][j], &host[i][j], sizeof(float)) != 0) {
        ++differ;
      }
    }
    EXPECT_EQ(differ, 0u) << "rank " << i / kSteps << " step " << i % kSteps;
  }
  // Every rank holds the same average.
  for (int r = 1; r < kWorld; ++r) {
    for (int s = 0; s < kSteps; ++s) {
      EXPECT_EQ(device[r * kSteps + s], device[s]) << "rank " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Codecs, DeviceReduceTest,
    ::testing::Values(Case{"none", {}, "cuda"}, Case{"fp16", {}, "cuda"},
                      Case{"bf16", {}, "cuda"},
                      Case{"int8", {{"stochastic", "true"}}, "cuda"},
                      Case{"qsgd", {{"bits", "4"}}, "cuda"},
                      Case{"topk", {{"ratio", "0.01"}}, "cuda"},
                      // Majority votes finish on the host.
                      Case{"signsgd", {}, "cuda"}, Case{"signum", {}, "cuda"},
                      Case{"efsign", {}, "cuda"},
                      Case{"onebit", {}, "cuda", {1, kNumel}},
                      Case{"terngrad", {}, "cuda"},
                      Case{"randomk", {{"ratio", "0.01"}}, "cuda"},
                      // No GPU twin: staged through the host.
                      Case{"threshold", {{"tau_rms", "2"}}, "cpu"}),
    [](const ::testing::TestParamInfo<Case>& info) {
      return info.param.codec;
    });

// A twin's Revert (the engine calls it when a step fails after the encode)
// gives the state back to within rounding: for each stateful codec with a
// GPU encoder, the state after two steps, then a third encoded and reverted.
TEST(DeviceRevertTest, AFailedStepLeavesTheStateAsItWas) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    GTEST_SKIP() << "no usable CUDA device";
  }
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  const size_t bytes = kNumel * sizeof(float);
  void* d_in = nullptr;
  ASSERT_EQ(cudaMalloc(&d_in, bytes), cudaSuccess);
  for (const Case& c :
       {Case{"topk", {{"ratio", "0.01"}}, "cuda"}, Case{"signum", {}, "cuda"},
        Case{"efsign", {}, "cuda"}, Case{"onebit", {}, "cuda", {1, kNumel}}}) {
    absl::StatusOr<std::unique_ptr<DeviceCodec>> twin =
        CreateDeviceCodec(CodecSpec{c.codec, c.params});
    ASSERT_TRUE(twin.ok()) << c.codec << ": " << twin.status();
    const std::vector<int64_t> shape =
        c.shape.empty() ? std::vector<int64_t>{kNumel} : c.shape;
    codecs::TensorState state;
    codecs::Bytes payload;
    codecs::StepContext ctx;
    std::map<std::string, std::vector<float>, std::less<>> state_before;
    for (int step = 0; step < 3; ++step) {
      if (step == 2) state_before = state.buffers();
      const std::vector<float> g = Gradient(0, step);
      ASSERT_EQ(cudaMemcpy(d_in, g.data(), bytes, cudaMemcpyHostToDevice),
                cudaSuccess);
      ctx.step = step;
      payload.clear();
      ASSERT_TRUE((*twin)
                      ->Encode(0, static_cast<const float*>(d_in), kNumel,
                               shape[0], state, ctx, &payload)
                      .ok())
          << c.codec;
    }
    (*twin)->Revert(0, static_cast<const float*>(d_in), kNumel, shape, state,
                    ctx, payload);
    for (const auto& [name, before] : state_before) {
      // The momentum that masking took from the sent coordinates: the
      // failed step's own, kept for its Revert.
      if (name == codecs::MomentumCorrection::kMaskedBuffer) continue;
      const std::vector<float>& after = state.buffers().at(name);
      ASSERT_EQ(after.size(), before.size()) << c.codec << " " << name;
      for (size_t i = 0; i < before.size(); ++i) {
        ASSERT_NEAR(after[i], before[i], 1e-5 * (1 + std::fabs(before[i])))
            << c.codec << " " << name << "[" << i << "]";
      }
    }
  }
  cudaFree(d_in);
}

// NaN/Inf in a device tensor, counted on the GPU as the host path counts
// them: a compressing codec refuses the tensor before its state takes them
// in (the next, finite step is finite), and a dense one passes them through.
TEST(DeviceNonfiniteTest, CompressingCodecsRefuseThemAndDenseOnesPassThem) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    GTEST_SKIP() << "no usable CUDA device";
  }
  codecs::StateStore store;
  Metrics metrics(&store, "t");
  LocalCollective collective;
  auto engine = Engine::Create(EngineOptions(), codecs::BuiltinCodecs(), &store,
                               &collective, &metrics, Policy());
  ASSERT_TRUE(engine.ok()) << engine.status();
  const size_t bytes = kNumel * sizeof(float);
  void* d_in = nullptr;
  void* d_out = nullptr;
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_in, bytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_out, bytes), cudaSuccess);
  const DeviceTensor device{0, d_in, d_out, bytes};
  auto reduce = [&](const std::vector<float>& g, const std::string& codec,
                    int step) {
    EXPECT_EQ(cudaMemcpy(d_in, g.data(), bytes, cudaMemcpyHostToDevice),
              cudaSuccess);
    ReduceInput in = Input(Case{codec, {}, "cuda"}, step);
    in.device = &device;
    return (*engine)->Reduce(in);
  };
  std::vector<float> bad = Gradient(0, 0);
  bad[5] = NAN;
  bad[700] = -INFINITY;

  absl::StatusOr<ReduceOutput> refused = reduce(bad, "topk", 0);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()),
              ::testing::HasSubstr("input holds 2 NaN/Inf values; codec "
                                   "'topk' compresses"));
  absl::StatusOr<ReduceOutput> next = reduce(Gradient(0, 1), "topk", 1);
  ASSERT_TRUE(next.ok()) << next.status();
  std::vector<float> out(kNumel);
  ASSERT_EQ(cudaMemcpy(out.data(), d_out, bytes, cudaMemcpyDeviceToHost),
            cudaSuccess);
  for (float v : out) ASSERT_TRUE(std::isfinite(v));

  absl::StatusOr<ReduceOutput> passed = reduce(bad, "none", 0);
  ASSERT_TRUE(passed.ok()) << passed.status();
  EXPECT_EQ(passed->stats.backend, "cuda");
  EXPECT_EQ(passed->stats.nonfinite_values, 2u);
  ASSERT_EQ(cudaMemcpy(out.data(), d_out, bytes, cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_TRUE(std::isnan(out[5]));
  EXPECT_EQ(out[700], -INFINITY);
  cudaFree(d_in);
  cudaFree(d_out);
}

}  // namespace
}  // namespace gradcomp::service
