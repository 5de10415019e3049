// Codec throughput on one 25M-float gradient (100 MB, the size of a large
// layer or a fused bucket): encode and decode of each CPU codec, the top-k
// selection alone, and a memcpy of the same bytes (one thread and all
// cores) as the ceiling. Bytes/s
// count the fp32 input. bench/run_codec_bench compares these with PyTorch.
//
//   bazel run //bench:codec_benchmark -- --benchmark_filter=Encode
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "codecs/builtin.h"
#include "codecs/codec.h"
#include "codecs/cpu/parallel.h"
#include "codecs/cpu/select.h"
#include "codecs/random.h"
#include "codecs/state.h"
#include "codecs/wire.h"

namespace gradcomp::codecs {
namespace {

constexpr size_t kNumel = 25'000'000;

// Gradient-like data: N(0, 1) times a log-uniform scale in [1e-4, 1] per
// block of 4096, as layers and channels differ by orders of magnitude.
const std::vector<float>& Gradient() {
  static const std::vector<float>* const g = [] {
    auto* out = new std::vector<float>(kNumel);
    std::mt19937 gen(12345);
    std::normal_distribution<float> normal;
    std::uniform_real_distribution<float> exponent(-4.0f, 0.0f);
    float scale = 1;
    for (size_t i = 0; i < kNumel; ++i) {
      if (i % 4096 == 0) scale = std::pow(10.0f, exponent(gen));
      (*out)[i] = scale * normal(gen);
    }
    return out;
  }();
  return *g;
}

struct CodecCase {
  const char* label;
  const char* codec;
  std::map<std::string, std::string> params;
};

const CodecCase kCases[] = {
    {"none", "none", {}},
    {"fp16", "fp16", {}},
    {"bf16", "bf16", {}},
    {"topk_0.001", "topk", {{"ratio", "0.001"}}},
    {"topk_0.01", "topk", {{"ratio", "0.01"}}},
    {"qsgd_4bit", "qsgd", {{"bits", "4"}}},
    {"randomk_0.01", "randomk", {{"ratio", "0.01"}}},
    {"threshold", "threshold", {}},
    {"terngrad", "terngrad", {}},
    {"int8", "int8", {}},
    {"int8_stochastic", "int8", {{"stochastic", "true"}}},
    {"signsgd", "signsgd", {}},
    {"efsign", "efsign", {}},
    {"signum", "signum", {}},
    {"onebit", "onebit", {}},
    {"atomo_entry_0.01", "atomo", {{"atoms", "entry"}}},
    // polar's default (4 bits: sign and 3 raw planes, no polar coding) and
    // 2.5 bits, where one plane goes through the polar code's SC encoder.
    {"polar_4", "polar", {}},
    {"polar_2.5", "polar", {{"bits_per_value", "2.5"}}},
};

std::unique_ptr<Codec> MakeCodec(const CodecCase& c) {
  absl::StatusOr<std::unique_ptr<Codec>> codec =
      BuiltinCodecs().Create(c.codec, CodecParams(c.params));
  if (!codec.ok()) {
    std::fprintf(stderr, "%s: %s\n", c.label,
                 std::string(codec.status().message()).c_str());
    std::abort();
  }
  return std::move(codec).value();
}

void Check(const absl::Status& status, benchmark::State& state) {
  if (!status.ok()) state.SkipWithError(std::string(status.message()).c_str());
}

void BM_Memcpy(benchmark::State& state) {
  const std::vector<float>& g = Gradient();
  std::vector<float> dst(g.size(), 0.0f);
  for (auto _ : state) {
    std::memcpy(dst.data(), g.data(), g.size() * sizeof(float));
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * g.size() * sizeof(float));
}

// The same copy split over the cores as the threaded codecs split their
// work: the machine's real memory bandwidth, and the stricter baseline.
void BM_MemcpyParallel(benchmark::State& state) {
  const std::vector<float>& g = Gradient();
  std::vector<float> dst(g.size(), 0.0f);
  for (auto _ : state) {
    ParallelFor(g.size(), ParallelOptions(),
                [&](size_t begin, size_t end, int) {
                  std::memcpy(dst.data() + begin, g.data() + begin,
                              (end - begin) * sizeof(float));
                });
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * g.size() * sizeof(float));
}

// The payload string is reused across iterations (its capacity stays), as
// the daemon reuses its buffers; a fresh 100 MB allocation per call would
// mostly measure page faults.
void BM_Encode(benchmark::State& state, const CodecCase* c) {
  const auto codec = MakeCodec(*c);
  const auto& single = dynamic_cast<const SingleRoundCodec&>(*codec);
  const std::vector<float>& g = Gradient();
  const int64_t shape[] = {static_cast<int64_t>(g.size())};
  TensorState tensor_state;
  StepContext ctx;
  ctx.seed = 1;
  Bytes payload;
  // One untimed step: state buffers (top-k's 200 MB) are made on first use.
  Check(single.Encode(TensorView{g, shape}, tensor_state, ctx, &payload),
        state);
  ++ctx.step;
  for (auto _ : state) {
    payload.clear();
    Check(single.Encode(TensorView{g, shape}, tensor_state, ctx, &payload),
          state);
    ++ctx.step;
    benchmark::DoNotOptimize(payload.data());
  }
  state.SetBytesProcessed(state.iterations() * g.size() * sizeof(float));
  state.counters["wire_bytes"] = static_cast<double>(payload.size());
}

void BM_Decode(benchmark::State& state, const CodecCase* c) {
  const auto codec = MakeCodec(*c);
  const auto& single = dynamic_cast<const SingleRoundCodec&>(*codec);
  const std::vector<float>& g = Gradient();
  const int64_t shape[] = {static_cast<int64_t>(g.size())};
  TensorState tensor_state;
  Bytes payload;
  Check(single.Encode(TensorView{g, shape}, tensor_state, StepContext(),
                      &payload),
        state);
  std::vector<float> acc(g.size(), 0.0f);
  for (auto _ : state) {
    Check(single.DecodeAdd(payload, 0.5f, absl::MakeSpan(acc)), state);
    benchmark::DoNotOptimize(acc.data());
  }
  state.SetBytesProcessed(state.iterations() * g.size() * sizeof(float));
}

// DGC's selection alone (sampled threshold, filter, values gathered): the
// peer of torch.topk(g.abs(), k) followed by g[indices].
void BM_TopKSelect(benchmark::State& state) {
  const std::vector<float>& g = Gradient();
  const double ratio = static_cast<double>(state.range(0)) / 1e4;
  const size_t k = static_cast<size_t>(std::ceil(ratio * g.size()));
  std::vector<float> values;
  int64_t step = 0;
  for (auto _ : state) {
    const TopKSelection sel =
        SelectTopK(g, k, 0.01, PhiloxStream(1, 0, step++, 0));
    values.resize(sel.indices.size());
    for (size_t j = 0; j < values.size(); ++j) values[j] = g[sel.indices[j]];
    benchmark::DoNotOptimize(values.data());
  }
  state.SetBytesProcessed(state.iterations() * g.size() * sizeof(float));
}

// A whole step of one worker (every round, the sum being its own body) on
// the gradient seen as a rows x cols matrix: PowerSGD's rounds, or ATOMO's
// SVD, encode and decode. Multi-round and matrix codecs do not fit
// BM_Encode's one-round, one-dimensional mould.
void BM_MatrixStep(benchmark::State& state, const char* codec_name,
                   int64_t rows, int64_t cols) {
  const auto codec = MakeCodec(CodecCase{codec_name, codec_name, {}});
  const std::vector<float> g(Gradient().begin(),
                             Gradient().begin() + rows * cols);
  const int64_t shape[] = {rows, cols};
  std::vector<float> out(g.size());
  TensorState tensor_state;
  StepContext ctx;
  const auto step = [&] {
    auto session = codec->Start(TensorView{g, shape}, tensor_state, ctx);
    Check(session.status(), state);
    while (true) {
      auto round = (*session)->NextRound();
      Check(round.status(), state);
      if (!round.ok() || !round->has_value()) break;
      RoundResult result;
      if ((*round)->collective == Collective::kSum) {
        auto parsed = PeekPayload((*round)->payload);
        result.sum.assign(parsed->body.size() / sizeof(float), 0.0f);
        Check(AddDenseBody(*parsed, 1.0f, absl::MakeSpan(result.sum)), state);
      } else {
        result.payloads.push_back(std::move((*round)->payload));
      }
      Check((*session)->Absorb(std::move(result)), state);
    }
    Check((*session)->Finish(absl::MakeSpan(out)), state);
    ++ctx.step;
    benchmark::DoNotOptimize(out.data());
  };
  // The first, untimed step allocates the state (PowerSGD's 100 MB
  // residual): the timed steps are the steady state, as in the daemon.
  step();
  for (auto _ : state) step();
  state.SetBytesProcessed(state.iterations() * g.size() * sizeof(float));
}

// One thread drawing the 25M uniforms that QSGD's stochastic rounding needs:
// the floor under its encode time (divided by the threads it runs on).
void BM_PhiloxFillUniform(benchmark::State& state) {
  const PhiloxStream rng(1, 2, 3, 0);
  std::vector<float> chunk(2048);
  for (auto _ : state) {
    for (size_t i = 0; i < kNumel; i += chunk.size()) {
      rng.FillUniform(i, absl::MakeSpan(chunk));
      benchmark::DoNotOptimize(chunk.data());
    }
  }
  state.SetBytesProcessed(state.iterations() * kNumel * sizeof(float));
}

// Wall time, not CPU time: codecs run threads for tensors this large.
void Configure(benchmark::internal::Benchmark* b) {
  b->UseRealTime()->Unit(benchmark::kMillisecond);
}

void RegisterAll() {
  Configure(benchmark::RegisterBenchmark("BM_Memcpy", BM_Memcpy));
  // PowerSGD rank 2 on all 25M floats as 5000 x 5000; ATOMO's SVD on a
  // ResNet-50 layer4 3x3 convolution (512 x 4608, 2.4M floats): an SVD of
  // the 25M-float matrix takes minutes.
  Configure(benchmark::RegisterBenchmark("BM_MatrixStep/powersgd_5000x5000",
                                         BM_MatrixStep, "powersgd", 5000,
                                         5000));
  Configure(benchmark::RegisterBenchmark("BM_MatrixStep/atomo_512x4608",
                                         BM_MatrixStep, "atomo", 512, 4608));
  Configure(
      benchmark::RegisterBenchmark("BM_MemcpyParallel", BM_MemcpyParallel));
  for (const CodecCase& c : kCases) {
    Configure(benchmark::RegisterBenchmark(
        (std::string("BM_Encode/") + c.label).c_str(), BM_Encode, &c));
    Configure(benchmark::RegisterBenchmark(
        (std::string("BM_Decode/") + c.label).c_str(), BM_Decode, &c));
  }
  Configure(benchmark::RegisterBenchmark("BM_PhiloxFillUniform",
                                         BM_PhiloxFillUniform));
  // Ratio in units of 1e-4: 10 = 0.001, 100 = 0.01.
  Configure(benchmark::RegisterBenchmark("BM_TopKSelect", BM_TopKSelect)
                ->Arg(10)
                ->Arg(100));
}

}  // namespace
}  // namespace gradcomp::codecs

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  gradcomp::codecs::RegisterAll();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
