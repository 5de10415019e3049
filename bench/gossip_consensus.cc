// The consensus experiment of PowerGossip (issue 10): W = 8 ranks on a ring
// and on a 2 x 4 torus start from random matrices and gossip; the consensus
// distance (sum_i ||x_i - mean||^2 / W, relative to its start) is recorded
// against the bytes each worker sent, for plain (exact) gossip, PowerGossip
// rank 1 and 2 (service/gossip, over the in-process neighbour exchange, so
// its bytes are the real messages), and a Choco-Gossip baseline with top-k
// compression (Koloskova et al., ICML 2019), simulated here in one thread
// with its message size counted as the same 32-byte header plus k (int32
// index, fp32 value) pairs.
//
//   bazel run -c opt //bench:gossip_consensus -- /tmp/consensus.csv
//   /usr/bin/python3 bench/plot_gossip_consensus.py /tmp/consensus.csv \
//       docs/gossip_consensus.png
#include <algorithm>
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

using bench::kCols;
using bench::kMaxBytes;
using bench::kN;
using bench::kRows;
using bench::kTarget;
using bench::kW;
using bench::Logged;
using bench::Start;

struct Point {
  int64_t step;
  double bytes;     // per worker, cumulative
  double distance;  // relative to the start
};

std::vector<Point> RunGossip(const Topology& topology, GossipOptions options) {
  std::vector<std::vector<float>> xs = Start();
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
    if (d < kTarget || mean_bytes > kMaxBytes) break;
  }
  return points;
}

// Choco-Gossip: x_hat_i is rank i's public copy, identical at its
// neighbours (they all add the same q_i), so one copy per rank suffices.
std::vector<Point> RunChoco(const Topology& topology, double ratio,
                            double gamma) {
  std::vector<std::vector<float>> xs = Start();
  const double d0 = ConsensusDistance(xs);
  std::vector<std::vector<float>> hat(kW, std::vector<float>(kN, 0.0f));
  const size_t k = static_cast<size_t>(std::ceil(ratio * kN));
  std::vector<Point> points = {{0, 0, 1}};
  double bytes = 0;
  std::vector<size_t> idx(kN);
  for (int64_t step = 1;; ++step) {
    for (int i = 0; i < kW; ++i) {
      std::vector<float> diff(kN);
      for (size_t e = 0; e < kN; ++e) diff[e] = xs[i][e] - hat[i][e];
      std::iota(idx.begin(), idx.end(), 0);
      std::nth_element(idx.begin(), idx.begin() + k, idx.end(),
                       [&](size_t a, size_t b) {
                         return std::fabs(diff[a]) > std::fabs(diff[b]);
                       });
      for (size_t e = 0; e < k; ++e) hat[i][idx[e]] += diff[idx[e]];
    }
    for (int i = 0; i < kW; ++i) {
      for (const Neighbour& n : topology.neighbours(i)) {
        const float c = static_cast<float>(gamma * n.weight);
        for (size_t e = 0; e < kN; ++e) {
          xs[i][e] += c * (hat[n.rank][e] - hat[i][e]);
        }
      }
    }
    bytes += topology.neighbours(0).size() * (32.0 + 8.0 * k);
    if (Logged(step)) {
      const double d = ConsensusDistance(xs) / d0;
      points.push_back({step, bytes, d});
      if (d < kTarget || bytes > kMaxBytes || !std::isfinite(d)) break;
    }
  }
  return points;
}

void Write(FILE* out, const std::string& topology, const std::string& method,
           const std::vector<Point>& points) {
  for (const Point& p : points) {
    std::fprintf(out, "%s,%s,%lld,%.0f,%.6e\n", topology.c_str(),
                 method.c_str(), static_cast<long long>(p.step), p.bytes,
                 p.distance);
  }
  std::fprintf(stderr, "%s %s: %lld steps, %.0f bytes/worker, distance %.3e\n",
               topology.c_str(), method.c_str(),
               static_cast<long long>(points.back().step), points.back().bytes,
               points.back().distance);
}

// The first (bytes) at which `points` reach `level`, or infinity.
double BytesTo(const std::vector<Point>& points, double level) {
  for (const Point& p : points) {
    if (p.distance <= level) return p.bytes;
  }
  return INFINITY;
}

int Main(int argc, char** argv) {
  FILE* out = argc > 1 ? std::fopen(argv[1], "w") : stdout;
  if (out == nullptr) {
    std::perror(argv[1]);
    return 1;
  }
  std::fprintf(out, "topology,method,step,bytes_per_worker,distance\n");
  for (const char* spec : {"ring", "torus"}) {
    absl::StatusOr<Topology> topology = Topology::Parse(spec, kW);
    if (!topology.ok()) return 1;
    GossipOptions exact;
    exact.mode = GossipOptions::Mode::kExact;
    Write(out, spec, "exact", RunGossip(*topology, exact));
    for (int rank : {1, 2}) {
      GossipOptions pg;
      pg.rank = rank;
      Write(out, spec, absl::StrCat("powergossip-r", rank),
            RunGossip(*topology, pg));
    }
    // Choco's consensus step size is tuned per run, as in the papers: the
    // one that reaches 1e-3 with the fewest bytes is kept.
    for (double ratio : {0.01, 0.05}) {
      std::vector<Point> best;
      double best_gamma = 0;
      for (double gamma : {0.05, 0.1, 0.2, 0.4, 0.8}) {
        std::vector<Point> points = RunChoco(*topology, ratio, gamma);
        if (best.empty() || BytesTo(points, 1e-3) < BytesTo(best, 1e-3)) {
          best = std::move(points);
          best_gamma = gamma;
        }
      }
      std::fprintf(stderr, "choco top-k %.2f: best gamma %.2f\n", ratio,
                   best_gamma);
      Write(out, spec,
            absl::StrCat("choco-topk-", static_cast<int>(ratio * 100), "pct"),
            best);
    }
  }
  if (out != stdout) std::fclose(out);
  return 0;
}

}  // namespace
}  // namespace gradcomp::service

int main(int argc, char** argv) { return gradcomp::service::Main(argc, argv); }
