// Allgather against sharded aggregation of GATHER codecs (top-k 1 %, QSGD
// 4-bit) for W = 2, 3, 4 ranks and tensors of 1M..25M values: bytes each
// worker sends, its CPU time, the wall time of all W ranks in this process
// (in-process transport), the relative error of the average against the
// true mean, and a modelled step time on 1 and 10 Gbit/s links. Prints a
// markdown table (docs/benchmarks.md, "Sharded or allgather").
//
//   bench/run_sharded_bench            # or: sharded_bench [timed_steps]
//
// The ranks share this machine's cores, so a rank's time is measured as CPU
// seconds (process CPU time / W): what one worker on its own core would
// spend. The model adds the bytes a worker sends at the link rate (a
// full-duplex port sends and receives at once); per-message latency is not
// modelled (2(W-1) messages for sharded against W-1).
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "codecs/builtin.h"
#include "codecs/codec.h"
#include "codecs/params.h"
#include "codecs/random.h"
#include "codecs/state.h"
#include "service/collective/in_process_group.h"
#include "service/collective/sharded_reduce.h"

namespace gradcomp::bench {
namespace {

double CpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

double WallSeconds() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// N(0, 1) times a log-uniform scale in [1e-4, 1] per block of 4096 values,
// as the codec benchmarks use; different for every rank and step.
std::vector<float> Gradient(int rank, int step, size_t n) {
  std::mt19937 rng(static_cast<uint32_t>(rank * 7919 + step * 104729 + 1));
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> exponent(-4.0f, 0.0f);
  std::vector<float> g(n);
  float scale = 1;
  for (size_t i = 0; i < n; ++i) {
    if (i % 4096 == 0) scale = std::pow(10.0f, exponent(rng));
    g[i] = scale * normal(rng);
  }
  return g;
}

struct Measure {
  double bytes_sent = 0;  // per worker, the busiest
  double cpu_per_rank = std::numeric_limits<double>::infinity();  // best step
  double wall = std::numeric_limits<double>::infinity();          // best step
  double relative_error = 0;  // ||avg - mean|| / ||mean||, last step
  // Sharded only: rank 0's stage seconds in the best step.
  double encode = 0, decode = 0;
};

// `steps` timed steps after one warm-up step of `mode` for W ranks.
absl::StatusOr<Measure> Run(const codecs::Codec& codec, int w, size_t n,
                            bool sharded, int steps) {
  service::InProcessGroup group(w);
  std::vector<codecs::StateStore> stores(w);
  const auto& single = dynamic_cast<const codecs::SingleRoundCodec&>(codec);
  const int64_t shape[] = {static_cast<int64_t>(n)};
  Measure m;
  for (int step = 0; step <= steps; ++step) {
    std::vector<std::vector<float>> grads(w), out(w);
    for (int r = 0; r < w; ++r) {
      grads[r] = Gradient(r, step, n);
      out[r].resize(n);
    }
    std::vector<absl::Status> status(w);
    std::vector<double> sent(w, 0);
    service::ShardedStats stages;
    const double cpu0 = CpuSeconds(), wall0 = WallSeconds();
    std::vector<std::thread> threads;
    for (int r = 0; r < w; ++r) {
      threads.emplace_back([&, r] {
        auto state = stores[r].Acquire("bench", "g", shape, 1);
        codecs::StepContext ctx;
        ctx.seed = 1;
        ctx.tensor_id = codecs::TensorId("g");
        ctx.step = step;
        ctx.rank = r;
        ctx.world_size = w;
        const service::RoundKey key{"bench", "g", step, 0};
        if (sharded) {
          std::vector<codecs::Bytes> parts;
          absl::StatusOr<service::ShardedStats> stats = service::ShardedReduce(
              group.collective(r), stores[r], single, key, grads[r], ctx,
              absl::MakeSpan(out[r]), &parts);
          status[r] = stats.status();
          if (!stats.ok()) return;
          if (r == 0) stages = *stats;
          uint64_t own_parts = 0;
          for (int j = 0; j < w; ++j) {
            own_parts += parts[j].size();
            if (j != r) sent[r] += parts[j].size();
          }
          sent[r] += double(w - 1) * (stats->wire_bytes - own_parts);
          return;
        }
        codecs::Bytes payload;
        status[r] = single.Encode({grads[r], shape}, *state, ctx, &payload);
        if (!status[r].ok()) return;
        sent[r] = double(w - 1) * payload.size();
        absl::StatusOr<codecs::RoundResult> got = group.collective(r).Run(
            key, {codecs::Collective::kGather, std::move(payload)});
        status[r] = got.ok() ? single.FinishGather(got->payloads, ctx,
                                                   absl::MakeSpan(out[r]))
                             : got.status();
      });
    }
    for (std::thread& t : threads) t.join();
    const double wall = WallSeconds() - wall0, cpu = CpuSeconds() - cpu0;
    for (int r = 0; r < w; ++r) {
      if (!status[r].ok()) return status[r];
    }
    if (step == 0) continue;  // warm-up: allocations, first state
    m.wall = std::min(m.wall, wall);
    if (cpu / w < m.cpu_per_rank) {
      m.encode = stages.encode_seconds;
      m.decode = stages.decode_seconds;
    }
    m.cpu_per_rank = std::min(m.cpu_per_rank, cpu / w);
    m.bytes_sent = *std::max_element(sent.begin(), sent.end());
    double diff = 0, norm = 0;
    for (size_t i = 0; i < n; ++i) {
      double mean = 0;
      for (int r = 0; r < w; ++r) mean += grads[r][i];
      mean /= w;
      diff += (out[0][i] - mean) * (out[0][i] - mean);
      norm += mean * mean;
    }
    m.relative_error = std::sqrt(diff / norm);
  }
  return m;
}

// Modelled step time of one worker on a link of `gbit` Gbit/s.
double Model(const Measure& m, double gbit) {
  return m.cpu_per_rank + m.bytes_sent * 8 / (gbit * 1e9);
}

// sharded_bench [timed_steps [codec [values]]]: 2 steps, every case.
int Main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 2;
  const std::string only_codec = argc > 2 ? argv[2] : "";
  const size_t only_size = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 0;
  struct Case {
    const char* label;
    const char* name;
    std::map<std::string, std::string> params;
  };
  const std::vector<Case> cases = {
      {"topk 1 %", "topk", {{"ratio", "0.01"}, {"momentum", "0"}}},
      {"qsgd 4-bit", "qsgd", {{"bits", "4"}, {"bucket", "512"}}},
  };
  std::printf(
      "| codec | W | values | MB sent / worker, allgather | sharded | "
      "CPU ms / rank, allgather | sharded | sharded rank 0 encode / decode "
      "ms | wall ms (W ranks, %u cores), "
      "allgather | sharded | rel. error, allgather | sharded | "
      "model 1 Gbit/s, sharded / allgather | model 10 Gbit/s, sharded / "
      "allgather |\n",
      std::thread::hardware_concurrency());
  std::printf(
      "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | "
      "---: | ---: | ---: | ---: |\n");
  for (const Case& c : cases) {
    auto codec =
        codecs::BuiltinCodecs().Create(c.name, codecs::CodecParams(c.params));
    if (!codec.ok()) {
      std::fprintf(stderr, "%s\n", codec.status().ToString().c_str());
      return 1;
    }
    if (!only_codec.empty() && only_codec != c.name) continue;
    for (size_t n : {size_t{1} << 20, size_t{4} << 20, size_t{25000000}}) {
      if (only_size != 0 && only_size != n) continue;
      for (int w : {2, 3, 4}) {
        absl::StatusOr<Measure> a = Run(**codec, w, n, false, steps);
        absl::StatusOr<Measure> s = Run(**codec, w, n, true, steps);
        if (!a.ok() || !s.ok()) {
          std::fprintf(stderr, "%s W=%d n=%zu: %s %s\n", c.label, w, n,
                       a.status().ToString().c_str(),
                       s.status().ToString().c_str());
          return 1;
        }
        std::printf(
            "| %s | %d | %.1fM | %.2f | %.2f | %.1f | %.1f | %.1f / %.1f | "
            "%.0f | %.0f | %.3f | %.3f | %.2fx | %.2fx |\n",
            c.label, w, n / 1e6, a->bytes_sent / 1e6, s->bytes_sent / 1e6,
            a->cpu_per_rank * 1e3, s->cpu_per_rank * 1e3, s->encode * 1e3,
            s->decode * 1e3, a->wall * 1e3, s->wall * 1e3, a->relative_error,
            s->relative_error, Model(*s, 1) / Model(*a, 1),
            Model(*s, 10) / Model(*a, 10));
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace gradcomp::bench

int main(int argc, char** argv) { return gradcomp::bench::Main(argc, argv); }
