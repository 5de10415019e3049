// The consensus experiment of PowerGossip (issue 10), at the paper's
// setting (epfml/powergossip, experiments/consensus_2.py): W = 8 ranks on a
// ring and on a 2 x 4 torus start from their own 56 x 56 matrix (random
// normal, a tile of Fashion-MNIST images, or one trained layer of 8 MLPs:
// bench/gossip_consensus_setup.h) and gossip; the consensus distance (sum_i
// ||x_i - mean||^2 / W, relative to its start) is recorded against the bytes
// each worker sent, for plain (exact) gossip, PowerGossip rank 1, 2, 4 and 8
// and Choco-Gossip with top-k (Koloskova et al., ICML 2019), all run by
// service/gossip's GossipNode over the in-process neighbour exchange, so every
// byte counted is a message sent.
//
// Choco's k is matched to PowerGossip's bytes per step, as in the paper:
// k = r (rows + cols) / 4 (indices and values: the numbers a rank-r power
// step sends on average), for r = 1 and 2, plus a generous 5 %.
// Every method's step size is tuned per run by one rule (Tune): 20
// log-spaced values, the one that reaches 1e-4 with the fewest bytes, or,
// when none does within kMaxBytes / 4, the one with the lowest distance
// there. Grids: Choco's consensus step in [1e-4, 1.308]; exact gossip's
// diffusion in [0.1, 2], less the values ValidateGossipRate refuses (from
// 1 / max_i sum_j w_ij: 1.5 on the ring, 4/3 on the torus; they diverge);
// PowerGossip's in [0.1, 0.99 / max w_ij], the whole range it allows.
// PowerGossip r = 1 and 2 also run at the paper's fixed diffusion 1.308,
// untuned.
//
//   /usr/bin/python3 bench/gossip_weights.py /tmp/gossip_consensus_weights.bin
//   bazel build -c opt //bench:gossip_consensus
//   bazel-out/k8-opt/bin/bench/gossip_consensus /tmp/consensus.csv
//
// and plot it with bench/plot_gossip_consensus.py (docs/gossip.md).
// Options (after the file): SIDE runs the random data only, at SIDE x SIDE
// (the paper's matrices are 100 x 100); --seeds=N the random data from N
// starts; --workers=N the data on N ranks (data "<data>-w<N>"; the weights
// file must hold N workers);
// --data=random,fashion-mnist,weights, --topologies=ring,torus and
// --methods=NAME,... a subset (--methods may also name the methods run only
// when named: bench::AllMethods); --weights=FILE where the trained weights
// are.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
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
using bench::kRows;
using bench::kTarget;
using bench::Logged;
using bench::Method;
using Tensors = std::vector<std::vector<float>>;

struct Point {
  int64_t step;
  double bytes;     // per worker, cumulative
  double distance;  // relative to the start
};

// Gossips `start` until the relative distance is below `target`, the bytes
// per worker pass `max_bytes`, or the run diverges.
std::vector<Point> Run(const Topology& topology, const GossipOptions& options,
                       const std::vector<int64_t>& shape, const Tensors& start,
                       double target, double max_bytes) {
  const int workers = static_cast<int>(start.size());
  Tensors xs = start;
  const double d0 = ConsensusDistance(xs);
  InProcessGroup group(workers);
  std::vector<std::unique_ptr<GossipNode>> nodes;
  for (int r = 0; r < workers; ++r) {
    nodes.push_back(std::make_unique<GossipNode>(topology, r, options, 7));
  }
  std::vector<double> bytes(workers, 0);
  std::vector<Point> points = {{0, 0, 1}};
  int64_t step = 0;
  while (true) {
    // Run to the next logged step on W threads, then measure.
    int64_t next = step + 1;
    while (!Logged(next)) ++next;
    std::vector<std::thread> threads;
    for (int r = 0; r < workers; ++r) {
      threads.emplace_back([&, r] {
        for (int64_t s = step; s < next; ++s) {
          absl::StatusOr<GossipStats> stats =
              nodes[r]->Round(group.collective(r), {"bench", "x", s, 0}, shape,
                              absl::MakeSpan(xs[r]));
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
        std::accumulate(bytes.begin(), bytes.end(), 0.0) / workers;
    const double d = ConsensusDistance(xs) / d0;
    points.push_back({step, mean_bytes, d});
    if (d < target || mean_bytes > max_bytes || !(d < kDiverged)) break;
  }
  return points;
}

void Write(FILE* out, const std::string& name, const std::string& topology,
           const std::string& method, double gamma,
           const std::vector<Point>& points) {
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

// A grid of step sizes: kGrid log-spaced values in [low, high].
struct Grid {
  double low;
  double high;
};
constexpr int kGrid = 20;
constexpr Grid kChocoGrid = {1e-4, 1.308};
constexpr Grid kExactGrid = {0.1, 2.0};
// PowerGossip: up to just below ValidateGossipRate's 1 / w_max.
Grid PowerGossipGrid(const Topology& topology) {
  return {0.1, 0.99 / MaxEdgeWeight(topology)};
}

// The step size (`options`.*`step`) on `grid` that reaches 1e-4 with the
// fewest bytes, else the lowest distance at the tuning budget. Runs from
// the largest step down, each cut at the best bytes so far, since it can
// only lose after that. Says so when the best is at the grid's edge.
double Tune(const Topology& topology, GossipOptions options,
            double GossipOptions::*step, Grid grid,
            const std::vector<int64_t>& shape, const Tensors& start) {
  constexpr double kLevel = 1e-4;
  constexpr double kBudget = kMaxBytes / 4;
  double best_gamma = 0, best_bytes = INFINITY, best_distance = INFINITY;
  int best_i = -1;
  for (int i = kGrid - 1; i >= 0; --i) {
    options.*step =
        grid.low * std::pow(grid.high / grid.low, i / (kGrid - 1.0));
    if (absl::Status valid = ValidateGossipRate(options, topology);
        !valid.ok()) {
      std::fprintf(stderr, "  gamma %.4g: refused (%s)\n", options.*step,
                   std::string(valid.message()).c_str());
      continue;
    }
    const std::vector<Point> points =
        Run(topology, options, shape, start, kLevel,
            std::isfinite(best_bytes) ? best_bytes : kBudget);
    const double bytes = BytesTo(points, kLevel);
    const double distance = points.back().distance;
    std::fprintf(stderr, "  gamma %.4g: %s %.4g\n", options.*step,
                 std::isfinite(bytes) ? "bytes to 1e-4" : "distance",
                 std::isfinite(bytes) ? bytes : distance);
    if (bytes < best_bytes ||
        (!std::isfinite(best_bytes) && distance < best_distance)) {
      best_gamma = options.*step;
      best_bytes = bytes;
      best_distance = distance;
      best_i = i;
    }
  }
  std::fprintf(stderr, "  best gamma %.4g (%s)%s\n", best_gamma,
               std::isfinite(best_bytes) ? "fewest bytes to 1e-4"
                                         : "none reached 1e-4: lowest distance",
               best_i == 0 || best_i == kGrid - 1 ? " AT THE GRID'S EDGE" : "");
  return best_gamma;
}

// Runs the methods of bench::AllMethods named in `only` (bench::Methods
// when empty) on `topology` from `start`, tuning the step sizes, and writes
// the runs to `out` as data `name`.
void RunAll(FILE* out, const std::string& name, const char* spec,
            const Topology& topology, const std::vector<int64_t>& shape,
            const Tensors& start, const std::vector<std::string>& only) {
  for (const Method& method : only.empty()
                                  ? bench::Methods(shape[0], shape[1])
                                  : bench::AllMethods(shape[0], shape[1])) {
    if (!only.empty() &&
        std::find(only.begin(), only.end(), method.name) == only.end()) {
      continue;
    }
    GossipOptions options;
    double GossipOptions::*step = &GossipOptions::gamma;
    Grid grid = kExactGrid;
    switch (method.kind) {
      case Method::Kind::kExact:
        options.mode = GossipOptions::Mode::kExact;
        step = &GossipOptions::exact_gamma;
        break;
      case Method::Kind::kPowerGossip:
        options.rank = method.rank;
        options.iterations = method.iterations;
        options.warm_start = method.warm_start;
        grid = PowerGossipGrid(topology);
        break;
      case Method::Kind::kChoco:
        options.mode = GossipOptions::Mode::kChoco;
        options.choco_fraction =
            static_cast<double>(method.k) / (shape[0] * shape[1]);
        grid = kChocoGrid;
        break;
    }
    if (method.tuned) {
      std::fprintf(stderr, "%s %s %s: tuning\n", name.c_str(), spec,
                   method.name.c_str());
      options.*step = Tune(topology, options, step, grid, shape, start);
    }
    Write(out, name, spec, method.name, options.*step,
          Run(topology, options, shape, start, kTarget, kMaxBytes));
  }
}

int Usage(const std::string& why) {
  std::fprintf(stderr,
               "%s\nusage: gossip_consensus OUT.csv [SIDE] [--seeds=N] "
               "[--workers=N] [--data=random,fashion-mnist,weights] "
               "[--topologies=ring,torus] [--methods=NAME,...] "
               "[--weights=FILE]\n",
               why.c_str());
  return 2;
}

// OUT.csv [SIDE]: the three data types at 56 x 56, or random only at SIDE
// x SIDE. --seeds=N: random only, from N starts (seeds 1..N, data
// "random-seed<k>"). --workers=N: --data's types on N ranks (data
// "<data>-w<N>"; W = 8 otherwise). --data, --topologies and --methods: a subset
// (names as in the CSV). --weights=FILE: the trained weights' file.
int Main(int argc, char** argv) {
  if (argc < 2) return Usage("no output file");
  int side = 0;
  int seeds = 0;
  int workers = 0;
  std::vector<Data> data_types(std::begin(bench::kData),
                               std::end(bench::kData));
  std::string weights_file = bench::kWeightsFile;
  std::vector<std::string> topologies = {"ring", "torus"};
  std::vector<std::string> only;
  for (int i = 2; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (absl::ConsumePrefix(&arg, "--seeds=")) {
      if (!absl::SimpleAtoi(arg, &seeds) || seeds < 1) {
        return Usage(
            absl::StrCat("--seeds=", arg, ": expected an integer >= 1"));
      }
    } else if (absl::ConsumePrefix(&arg, "--workers=")) {
      if (!absl::SimpleAtoi(arg, &workers) || workers < 2) {
        return Usage(
            absl::StrCat("--workers=", arg, ": expected an integer >= 2"));
      }
    } else if (absl::ConsumePrefix(&arg, "--data=")) {
      data_types.clear();
      for (absl::string_view name : absl::StrSplit(arg, ',')) {
        absl::StatusOr<Data> data = bench::ParseData(std::string(name));
        if (!data.ok()) return Usage(std::string(data.status().message()));
        data_types.push_back(*data);
      }
    } else if (absl::ConsumePrefix(&arg, "--weights=")) {
      weights_file = std::string(arg);
    } else if (absl::ConsumePrefix(&arg, "--topologies=")) {
      topologies = absl::StrSplit(arg, ',');
    } else if (absl::ConsumePrefix(&arg, "--methods=")) {
      only = absl::StrSplit(arg, ',');
    } else if (!absl::SimpleAtoi(arg, &side) || side < 2) {
      return Usage(
          absl::StrCat("SIDE is '", arg, "': expected an integer >= 2"));
    }
  }
  if (workers > 0 && (seeds > 0 || side > 0)) {
    return Usage(
        "--workers runs W = 8's data on other worker counts: it "
        "goes with neither SIDE nor --seeds");
  }
  FILE* out = std::fopen(argv[1], "w");
  if (out == nullptr) {
    std::perror(argv[1]);
    return 1;
  }
  std::fprintf(out,
               "data,topology,method,gamma,step,bytes_per_worker,distance\n");
  // Every data type first, so that a missing file fails before any run.
  std::vector<std::pair<std::string, Tensors>> starts;
  const int rows = side > 0 ? side : kRows;
  const int cols = side > 0 ? side : kCols;
  if (seeds > 0) {
    for (int seed = 1; seed <= seeds; ++seed) {
      starts.push_back({absl::StrCat("random-seed", seed),
                        bench::StartRandom(rows, cols, seed)});
    }
  } else if (side > 0) {
    starts.push_back({"random", bench::StartRandom(side, side)});
  } else {
    for (Data data : data_types) {
      absl::StatusOr<Tensors> start =
          bench::Start(data, weights_file, workers > 0 ? workers : bench::kW);
      if (!start.ok()) {
        std::fprintf(stderr, "%s\n", start.status().ToString().c_str());
        return 1;
      }
      starts.push_back(
          {absl::StrCat(bench::DataName(data),
                        workers > 0 ? absl::StrCat("-w", workers) : ""),
           *std::move(start)});
    }
  }
  const std::vector<int64_t> shape = {rows, cols};
  for (const auto& [name, start] : starts) {
    for (const std::string& spec : topologies) {
      absl::StatusOr<Topology> topology =
          Topology::Parse(spec, static_cast<int>(start.size()));
      if (!topology.ok()) {
        return Usage(absl::StrCat("topology '", spec,
                                  "': ", topology.status().message()));
      }
      RunAll(out, name, spec.c_str(), *topology, shape, start, only);
      std::fflush(out);
    }
  }
  std::fclose(out);
  return 0;
}

}  // namespace
}  // namespace gradcomp::service

int main(int argc, char** argv) { return gradcomp::service::Main(argc, argv); }
