// What error sampling costs inside the engine: one ResNet-50-sized step (16
// tensors of 1.6M floats, 25.6M in all) through Engine::Reduce over a
// LocalCollective, with error_sample_rate 0 and 1, in one process so that
// both engines share its allocator, threads and load. Reports wall time and
// process CPU time per step. bench/metrics_sampling.py measures the same
// through real daemons.
//
//   bazel run -c opt //bench:metrics_sampling_benchmark -- \
//       --benchmark_repetitions=5 --benchmark_enable_random_interleaving=true \
//       --benchmark_report_aggregates_only=true --benchmark_min_time=3
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "codecs/builtin.h"
#include "codecs/state.h"
#include "service/collective/local_collective.h"
#include "service/engine/engine.h"
#include "service/metrics/metrics.h"

namespace gradcomp::service {
namespace {

constexpr int kTensors = 16;
constexpr int64_t kRows = 1600;
constexpr int64_t kCols = 1000;

struct Codec {
  const char* label;
  CodecSpec spec;
};
const Codec kCodecs[] = {
    {"topk_1pct", {"topk", {{"ratio", "0.01"}}}},
    {"qsgd_4bit", {"qsgd", {{"bits", "4"}}}},
};

const std::vector<std::string>& Gradients() {
  static const auto* grads = [] {
    auto* out = new std::vector<std::string>();
    std::mt19937 rng(1);
    std::student_t_distribution<float> t(3);
    std::vector<float> values(kRows * kCols);
    for (int i = 0; i < kTensors; ++i) {
      for (float& v : values) v = 1e-3f * t(rng);
      out->emplace_back(reinterpret_cast<const char*>(values.data()),
                        values.size() * sizeof(float));
    }
    return out;
  }();
  return *grads;
}

// state.range(0): codec index; state.range(1): error_sample_rate in %.
void BM_Step(benchmark::State& state) {
  const Codec& codec = kCodecs[state.range(0)];
  codecs::StateStore store;
  Metrics metrics(&store, "bench");
  LocalCollective collective;
  EngineOptions options;
  options.error_sample_rate = state.range(1) / 100.0;
  auto engine = Engine::Create(options, codecs::BuiltinCodecs(), &store,
                               &collective, &metrics, Policy());
  if (!engine.ok()) {
    state.SkipWithError(std::string(engine.status().message()).c_str());
    return;
  }
  const std::vector<std::string>& grads = Gradients();
  // Step 0 allocates the codecs' state and the engine's buffers: untimed.
  int64_t step = 0;
  auto run_step = [&]() -> absl::Status {
    for (int i = 0; i < kTensors; ++i) {
      ReduceInput in;
      in.job = "bench";
      in.tensor = absl::StrCat("layer", i, ".weight");
      in.step = step;
      in.shape = {kRows, kCols};
      in.data = grads[i];
      in.codec = codec.spec;
      absl::StatusOr<ReduceOutput> out = (*engine)->Reduce(in);
      if (!out.ok()) return out.status();
      benchmark::DoNotOptimize(out->data);
    }
    ++step;
    return absl::OkStatus();
  };
  if (absl::Status warm = run_step(); !warm.ok()) {
    state.SkipWithError(std::string(warm.message()).c_str());
    return;
  }
  for (auto _ : state) {
    if (absl::Status status = run_step(); !status.ok()) {
      state.SkipWithError(std::string(status.message()).c_str());
      return;
    }
  }
  state.SetLabel(
      absl::StrCat(codec.label, " rate ", options.error_sample_rate));
}

BENCHMARK(BM_Step)
    ->ArgsProduct({{0, 1}, {0, 10, 100}})
    ->Unit(benchmark::kMillisecond)
    ->MeasureProcessCPUTime()
    ->UseRealTime();

}  // namespace
}  // namespace gradcomp::service

BENCHMARK_MAIN();
