// The consensus experiment of PowerGossip (issue 10), at the paper's
// setting (epfml/powergossip, experiments/consensus_2.py): W = 8 ranks on a
// ring and on a 2 x 4 torus start from their own 56 x 56 matrix (random
// normal, or a tile of Fashion-MNIST images: bench/gossip_consensus_setup.h)
// and gossip; the consensus distance (sum_i ||x_i - mean||^2 / W, relative
// to its start) is recorded against the bytes each worker sent, for plain
// (exact) gossip, PowerGossip rank 1 and 2 and Choco-Gossip with top-k
// (Koloskova et al., ICML 2019), all run by service/gossip's GossipNode over
// the in-process neighbour exchange, so every byte counted is a message
// sent.
//
// Choco's k is matched to PowerGossip's bytes per step, as in the paper:
// k = r (rows + cols) / 4 (indices and values: the numbers a rank-r power
// step sends on average), for r = 1 and 2, plus a generous 5 %. Its
// consensus step size is tuned per run over 20 log-spaced values in
// [1e-4, 1.308]: the one that reaches 1e-4 with the fewest bytes, or, when
// none does within kMaxBytes / 4, the one with the lowest distance there.
// PowerGossip uses the paper's diffusion 1.308 throughout.
//
//   bazel run -c opt //bench:gossip_consensus -- /tmp/consensus.csv
//   /usr/bin/python3 bench/plot_gossip_consensus.py /tmp/consensus.csv \
//       docs/gossip_consensus.png
#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/gossip_consensus_setup.h"
#include "service/collective/in_process_group.h"
#include "service/gossip/power_gossip.h"
#include "service/gossip/topology.h"

namespace gradcomp::service {
namespace {

using bench::Data;
using bench::kCols;
using bench::kDiverged;
using bench::kMaxBytes;
using bench::kN;
using bench::kRows;
using bench::kTarget;
using bench::kW;
using bench::Logged;
using Tensors = std::vector<std::vector<float>>;

struct Point {
  int64_t step;
  double bytes;     // per worker, cumulative
  double distance;  // relative to the start
};

// Gossips `start` until the relative distance is below `target`, the bytes
// per worker pass `max_bytes`, or the run diverges.
std::vector<Point> Run(const Topology& topology, const GossipOptions& options,
                       const Tensors& start, double target, double max_bytes) {
  Tensors xs = start;
  const double d0 = ConsensusDistance(xs);
  InProcessGroup group(kW);
  std::vector<std::unique_ptr<GossipNode>> nodes;
  for (int r = 0; r < kW; ++r) {
    nodes.push_back(std::make_unique<GossipNode>(topology, r, options, 7));
  }
  std::vector<double> bytes(kW, 0);
  std::vector<Point> points = {{0, 0, 1}};
  int64_t step = 0;
  while (true) {
    // Run to the next logged step on W threads, then measure.
    int64_t next = step + 1;
    while (!Logged(next)) ++next;
    std::vector<std::thread> threads;
    for (int r = 0; r < kW; ++r) {
      threads.emplace_back([&, r] {
        for (int64_t s = step; s < next; ++s) {
          absl::StatusOr<GossipStats> stats =
              nodes[r]->Round(group.collective(r), {"bench", "x", s, 0},
                              {kRows, kCols}, absl::MakeSpan(xs[r]));
          if (!stats.ok()) {
            std::fprintf(stderr, "rank %d: %s\n", r,
                         std::string(stats.status().message()).c_str());
            std::abort();
          }
          bytes[r] += stats->bytes_sent;
        }
      });
    }
    for (auto& t : threads) t.join();
    step = next;
    const double mean_bytes =
        std::accumulate(bytes.begin(), bytes.end(), 0.0) / kW;
    const double d = ConsensusDistance(xs) / d0;
    points.push_back({step, mean_bytes, d});
    if (d < target || mean_bytes > max_bytes || !(d < kDiverged)) break;
  }
  return points;
}

void Write(FILE* out, Data data, const std::string& topology,
           const std::string& method, double gamma,
           const std::vector<Point>& points) {
  const std::string name = bench::DataName(data);
  for (const Point& p : points) {
    std::fprintf(out, "%s,%s,%s,%.17g,%lld,%.0f,%.6e\n", name.c_str(),
                 topology.c_str(), method.c_str(), gamma,
                 static_cast<long long>(p.step), p.bytes, p.distance);
  }
  std::fprintf(stderr,
               "%s %s %s (gamma %.4g): %lld steps, %.0f bytes/worker, "
               "distance %.3e\n",
               name.c_str(), topology.c_str(), method.c_str(), gamma,
               static_cast<long long>(points.back().step), points.back().bytes,
               points.back().distance);
}

// The first bytes at which `points` reach `level`, or infinity.
double BytesTo(const std::vector<Point>& points, double level) {
  for (const Point& p : points) {
    if (p.distance <= level) return p.bytes;
  }
  return INFINITY;
}

// Choco's step size for `options` (fraction set): the grid's value that
// reaches 1e-4 with the fewest bytes, else the lowest distance at the
// tuning budget. Runs from the largest step down, each cut at the best
// bytes so far, since it can only lose after that.
double TuneChoco(const Topology& topology, GossipOptions options,
                 const Tensors& start) {
  constexpr int kGrid = 20;
  constexpr double kLow = 1e-4, kHigh = 1.308, kLevel = 1e-4;
  constexpr double kBudget = kMaxBytes / 4;
  double best_gamma = 0, best_bytes = INFINITY, best_distance = INFINITY;
  for (int i = kGrid - 1; i >= 0; --i) {
    options.gamma = kLow * std::pow(kHigh / kLow, i / (kGrid - 1.0));
    const std::vector<Point> points =
        Run(topology, options, start, kLevel,
            std::isfinite(best_bytes) ? best_bytes : kBudget);
    const double bytes = BytesTo(points, kLevel);
    const double distance = points.back().distance;
    std::fprintf(stderr, "  gamma %.4g: %s %.4g\n", options.gamma,
                 std::isfinite(bytes) ? "bytes to 1e-4" : "distance",
                 std::isfinite(bytes) ? bytes : distance);
    if (bytes < best_bytes ||
        (!std::isfinite(best_bytes) && distance < best_distance)) {
      best_gamma = options.gamma;
      best_bytes = bytes;
      best_distance = distance;
    }
  }
  std::fprintf(stderr, "  best gamma %.4g (%s)\n", best_gamma,
               std::isfinite(best_bytes)
                   ? "fewest bytes to 1e-4"
                   : "none reached 1e-4: lowest distance");
  return best_gamma;
}

int Main(int argc, char** argv) {
  FILE* out = argc > 1 ? std::fopen(argv[1], "w") : stdout;
  if (out == nullptr) {
    std::perror(argv[1]);
    return 1;
  }
  std::fprintf(out,
               "data,topology,method,gamma,step,bytes_per_worker,distance\n");
  // Both data types first, so that missing images fail before any run.
  std::vector<Tensors> starts;
  for (Data data : bench::kData) {
    absl::StatusOr<Tensors> start = bench::Start(data);
    if (!start.ok()) {
      std::fprintf(stderr, "%s\n", start.status().ToString().c_str());
      return 1;
    }
    starts.push_back(*std::move(start));
  }
  for (size_t d = 0; d < starts.size(); ++d) {
    const Data data = bench::kData[d];
    const Tensors* start = &starts[d];
    for (const char* spec : {"ring", "torus"}) {
      absl::StatusOr<Topology> topology = Topology::Parse(spec, kW);
      if (!topology.ok()) return 1;
      GossipOptions exact;
      exact.mode = GossipOptions::Mode::kExact;
      Write(out, data, spec, "exact", exact.exact_gamma,
            Run(*topology, exact, *start, kTarget, kMaxBytes));
      for (int rank : {1, 2}) {
        GossipOptions pg;
        pg.rank = rank;
        Write(out, data, spec, absl::StrCat("powergossip-r", rank), pg.gamma,
              Run(*topology, pg, *start, kTarget, kMaxBytes));
      }
      // k matched to PowerGossip rank r: k = r (rows + cols) / 4.
      for (int k : {(kRows + kCols) / 4, (kRows + kCols) / 2,
                    static_cast<int>(std::ceil(0.05 * kN))}) {
        GossipOptions choco;
        choco.mode = GossipOptions::Mode::kChoco;
        choco.choco_fraction = static_cast<double>(k) / kN;
        const std::string method = absl::StrCat("choco-k", k);
        std::fprintf(stderr, "%s %s %s: tuning\n",
                     bench::DataName(data).c_str(), spec, method.c_str());
        choco.gamma = TuneChoco(*topology, choco, *start);
        Write(out, data, spec, method, choco.gamma,
              Run(*topology, choco, *start, kTarget, kMaxBytes));
      }
    }
  }
  if (out != stdout) std::fclose(out);
  return 0;
}

}  // namespace
}  // namespace gradcomp::service

int main(int argc, char** argv) { return gradcomp::service::Main(argc, argv); }
