// The consensus experiment of PowerGossip (issue 10) through real gradcompd
// processes on loopback (tests/integration/cluster.h; 8, or --workers=N),
// one client thread per daemon sending Reduce requests in gossip mode:
// every run of the in-process CSV (the first argument) whose method is one
// of bench::AllMethods (exact gossip, PowerGossip at the paper's diffusion,
// tuned, and tuned with fresh factors every round, Choco-Gossip top-k), on
// the topologies and data types that CSV holds, from the same matrices,
// seed, tensor name and options as bench/gossip_consensus.cc, so the curves
// should match the in-process ones step for step. Every method runs at the
// step size that run used (tuned or fixed), read from its CSV. Bytes per
// worker are the daemons' own counts (ReduceStats.wire_bytes: the gossip
// messages each daemon sent).
//
//   bazel build //service:gradcompd //bench:gossip_consensus_daemons
//   GRADCOMPD=$PWD/bazel-bin/service/gradcompd \
//       bazel-bin/bench/gossip_consensus_daemons /tmp/consensus.csv \
//       /tmp/daemons.csv
//
// (a third argument: bench/gossip_weights.py's file, if not the default;
// --workers=N: N daemons, for an in-process CSV run with --workers=N, whose
// data are named "<data>-w<N>"; --side=SIDE: SIDE x SIDE random matrices,
// for the CSV of `gossip_consensus OUT SIDE`, whose data are named "random"
// as at 56 x 56).
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "bench/gossip_consensus_setup.h"
#include "client/cpp/client.h"
#include "service/gossip/power_gossip.h"
#include "tests/integration/cluster.h"

namespace gradcomp::testing {
namespace {

using bench::Data;
using bench::kCols;
using bench::kDiverged;
using bench::kMaxBytes;
using bench::kRows;
using bench::kTarget;
using bench::kW;
using bench::Logged;
using bench::Method;
using service::ConsensusDistance;
using Tensors = std::vector<std::vector<float>>;

// Gossips job `job` until the relative distance reaches kTarget; writes a
// CSV row per logged step. False on an error (printed).
bool Run(std::vector<std::unique_ptr<client::Client>>& clients,
         const Tensors& start, const std::string& job, const std::string& data,
         const std::string& topology, const std::string& method,
         const std::vector<int64_t>& shape, const v1::GossipSpec& spec,
         FILE* out) {
  const int workers = static_cast<int>(clients.size());
  Tensors xs = start;
  const double d0 = ConsensusDistance(xs);
  std::vector<double> bytes(workers, 0);
  std::vector<std::string> errors(workers);
  const double gamma = spec.diffusion() == 0 ? 1.0 : spec.diffusion();
  const std::string prefix =
      absl::StrCat(data, ",", topology, ",", method, ",");
  std::fprintf(out, "%s%.17g,0,0,1\n", prefix.c_str(), gamma);
  int64_t step = 0;
  double d = 1, mean_bytes = 0;
  while (d >= kTarget && mean_bytes <= kMaxBytes && d < kDiverged) {
    int64_t next = step + 1;
    while (!Logged(next)) ++next;
    std::vector<std::thread> threads;
    for (int r = 0; r < workers; ++r) {
      threads.emplace_back([&, r] {
        for (int64_t s = step; s < next && errors[r].empty(); ++s) {
          auto got = clients[r]->Gossip(job, "x", s, xs[r], shape, spec);
          if (!got.ok()) {
            errors[r] = got.status().ToString();
            return;
          }
          xs[r] = std::move(got->values);
          bytes[r] += got->stats.wire_bytes();
        }
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < workers; ++r) {
      if (!errors[r].empty()) {
        std::fprintf(stderr, "%s rank %d: %s\n", job.c_str(), r,
                     errors[r].c_str());
        return false;
      }
    }
    step = next;
    mean_bytes = std::accumulate(bytes.begin(), bytes.end(), 0.0) / workers;
    d = ConsensusDistance(xs) / d0;
    std::fprintf(out, "%s%.17g,%lld,%.0f,%.6e\n", prefix.c_str(), gamma,
                 static_cast<long long>(step), mean_bytes, d);
  }
  std::fprintf(stderr,
               "%s %s %s: %lld steps, %.0f bytes/worker, distance %.3e\n",
               data.c_str(), topology.c_str(), method.c_str(),
               static_cast<long long>(step), mean_bytes, d);
  return true;
}

// (data, topology, method) -> gamma of bench/gossip_consensus.cc's CSV
// rows; an empty map when the file cannot be read or parsed (printed).
using Gammas =
    std::map<std::tuple<std::string, std::string, std::string>, double>;
Gammas ReadGammas(const char* path) {
  Gammas gammas;
  std::ifstream in(path);
  std::string line;
  if (!std::getline(in, line) ||
      line != "data,topology,method,gamma,step,bytes_per_worker,distance") {
    std::fprintf(stderr,
                 "%s: expected bench/gossip_consensus.cc's CSV, with the "
                 "header data,topology,method,gamma,...\n",
                 path);
    return {};
  }
  while (std::getline(in, line)) {
    std::vector<std::string> cells = absl::StrSplit(line, ',');
    double gamma = 0;
    if (cells.size() != 7 || !absl::SimpleAtod(cells[3], &gamma)) {
      std::fprintf(stderr, "%s: cannot parse the row '%s'\n", path,
                   line.c_str());
      return {};
    }
    gammas[{cells[0], cells[1], cells[2]}] = gamma;
  }
  return gammas;
}

int Usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s IN_PROCESS_CSV OUT_CSV [WEIGHTS_FILE] [--workers=N] "
               "[--side=SIDE] (the first from bench/gossip_consensus.cc, for "
               "the tuned steps; the weights bench/gossip_weights.py's, "
               "default %s; N daemons, default %d, for a CSV run with "
               "--workers=N; SIDE x SIDE random matrices, default %d x %d, "
               "for a CSV run with SIDE)\n",
               argv0, bench::kWeightsFile, kW, kRows, kCols);
  return 2;
}

int Main(int argc, char** argv) {
  std::vector<std::string> args;
  int workers = 0;
  int side = 0;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (absl::ConsumePrefix(&arg, "--workers=")) {
      if (!absl::SimpleAtoi(arg, &workers) || workers < 2) {
        std::fprintf(stderr, "--workers=%s: expected an integer >= 2\n",
                     std::string(arg).c_str());
        return Usage(argv[0]);
      }
    } else if (absl::ConsumePrefix(&arg, "--side=")) {
      if (!absl::SimpleAtoi(arg, &side) || side < 2) {
        std::fprintf(stderr, "--side=%s: expected an integer >= 2\n",
                     std::string(arg).c_str());
        return Usage(argv[0]);
      }
    } else {
      args.push_back(std::string(arg));
    }
  }
  if (args.size() != 2 && args.size() != 3) return Usage(argv[0]);
  // As bench/gossip_consensus.cc, which runs SIDE on W = 8 only.
  if (side > 0 && workers > 0) {
    std::fprintf(stderr, "--side and --workers: a CSV has at most one\n");
    return Usage(argv[0]);
  }
  const int rows = side > 0 ? side : kRows;
  const int cols = side > 0 ? side : kCols;
  const std::vector<Method> methods = bench::AllMethods(rows, cols);
  const std::string weights_file =
      args.size() == 3 ? args[2] : bench::kWeightsFile;
  // bench/gossip_consensus.cc names the data of a --workers=N run
  // "<data>-w<N>".
  const std::string suffix =
      workers > 0 ? absl::StrCat("-w", workers) : std::string();
  if (workers == 0) workers = kW;
  const Gammas gammas = ReadGammas(args[0].c_str());
  if (gammas.empty()) return 1;
  // The data types and topologies the in-process run has.
  std::vector<std::pair<std::string, Tensors>> starts;
  std::vector<std::string> topologies;
  for (const auto& [run, gamma] : gammas) {
    if (std::find(topologies.begin(), topologies.end(), std::get<1>(run)) ==
        topologies.end()) {
      topologies.push_back(std::get<1>(run));
    }
  }
  for (Data data : bench::kData) {
    const std::string name = bench::DataName(data) + suffix;
    if (std::none_of(gammas.begin(), gammas.end(), [&](const auto& g) {
          return std::get<0>(g.first) == name;
        })) {
      continue;
    }
    if (side > 0 && data != Data::kRandom) {
      std::fprintf(stderr,
                   "%s holds %s data: a CSV of `gossip_consensus OUT SIDE` "
                   "holds random data only\n",
                   args[0].c_str(), name.c_str());
      return 1;
    }
    // gossip_consensus OUT SIDE starts from StartRandom(SIDE, SIDE).
    absl::StatusOr<Tensors> start =
        side > 0 ? bench::StartRandom(side, side)
                 : bench::Start(data, weights_file, workers);
    if (!start.ok()) {
      std::fprintf(stderr, "%s\n", start.status().ToString().c_str());
      return 1;
    }
    starts.push_back({name, *std::move(start)});
  }
  if (starts.empty()) {
    std::fprintf(
        stderr,
        "%s holds no data named random%s, fashion-mnist%s or "
        "weights%s: expected bench/gossip_consensus.cc's CSV%s\n",
        args[0].c_str(), suffix.c_str(), suffix.c_str(), suffix.c_str(),
        suffix.empty()
            ? " of W = 8"
            : absl::StrCat(" of a --workers=", workers, " run").c_str());
    return 1;
  }
  // A run of the CSV that no method here names (Choco's k depends on the
  // side) would be left out: the CSV is of another size.
  for (const auto& [run, gamma] : gammas) {
    const auto& [name, topology, method] = run;
    if (std::any_of(starts.begin(), starts.end(),
                    [&](const auto& s) { return s.first == name; }) &&
        std::none_of(methods.begin(), methods.end(),
                     [&](const Method& m) { return m.name == method; })) {
      std::fprintf(stderr,
                   "%s: %s %s %s is no method at %d x %d: for a CSV of "
                   "`gossip_consensus OUT SIDE`, pass --side=SIDE\n",
                   args[0].c_str(), name.c_str(), topology.c_str(),
                   method.c_str(), rows, cols);
      return 1;
    }
  }
  FILE* out = std::fopen(args[1].c_str(), "w");
  if (out == nullptr) {
    std::perror(args[1].c_str());
    return 1;
  }
  Cluster cluster(workers, absl::Seconds(60));
  if (absl::Status up = cluster.StartAll(); !up.ok()) {
    std::fprintf(stderr, "%s\n", up.ToString().c_str());
    return 1;
  }
  std::vector<std::unique_ptr<client::Client>> clients;
  for (int r = 0; r < workers; ++r) {
    auto client = client::Client::Connect(cluster.daemon(r).target());
    if (!client.ok()) return 1;
    clients.push_back(std::move(*client));
  }
  std::fprintf(out,
               "data,topology,method,gamma,step,bytes_per_worker,distance\n");
  for (const auto& [name, start] : starts) {
    for (const std::string& topology : topologies) {
      for (const Method& method : methods) {
        auto gamma = gammas.find({name, topology, method.name});
        if (gamma == gammas.end()) continue;
        v1::GossipSpec spec;
        spec.set_topology(topology);
        spec.set_diffusion(gamma->second);
        switch (method.kind) {
          case Method::Kind::kExact:
            break;
          case Method::Kind::kPowerGossip:
            spec.set_rank(method.rank);
            spec.set_power_steps(method.iterations);
            spec.set_fresh_factors(!method.warm_start);
            break;
          case Method::Kind::kChoco:
            spec.set_choco_topk_fraction(static_cast<double>(method.k) /
                                         (rows * cols));
            break;
        }
        const std::string job =
            absl::StrCat(name, "-", topology, "-", method.name);
        if (!Run(clients, start, job, name, topology, method.name, {rows, cols},
                 spec, out)) {
          return 1;
        }
        std::fflush(out);
      }
    }
  }
  std::fclose(out);
  return 0;
}

}  // namespace
}  // namespace gradcomp::testing

int main(int argc, char** argv) { return gradcomp::testing::Main(argc, argv); }
