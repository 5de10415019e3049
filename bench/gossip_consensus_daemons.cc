// The consensus experiment of PowerGossip (issue 10) through eight real
// gradcompd processes on loopback (tests/integration/cluster.h), one client
// thread per daemon sending Reduce requests in gossip mode: plain (exact)
// gossip and PowerGossip rank 1 and 2 on a ring and on a 2 x 4 torus, from
// the same random 64 x 64 matrices, seed, tensor name and options as
// bench/gossip_consensus.cc, so the curves should match the in-process ones
// step for step. Bytes per worker are the daemons' own counts
// (ReduceStats.wire_bytes: the gossip messages each daemon sent). The
// Choco top-k baseline exists only in bench/gossip_consensus.cc.
//
//   bazel build //service:gradcompd //bench:gossip_consensus_daemons
//   GRADCOMPD=$PWD/bazel-bin/service/gradcompd \
//       bazel-bin/bench/gossip_consensus_daemons /tmp/consensus_daemons.csv
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
#include "client/cpp/client.h"
#include "service/gossip/power_gossip.h"
#include "tests/integration/cluster.h"

namespace gradcomp::testing {
namespace {

using bench::kCols;
using bench::kMaxBytes;
using bench::kRows;
using bench::kTarget;
using bench::kW;
using bench::Logged;
using bench::Start;
using service::ConsensusDistance;
using Tensors = std::vector<std::vector<float>>;

// Gossips job `job` until the relative distance reaches kTarget; writes a
// CSV row per logged step. False on an error (printed).
bool Run(std::vector<std::unique_ptr<client::Client>>& clients,
         const std::string& job, const std::string& topology,
         const std::string& method, const v1::GossipSpec& spec, FILE* out) {
  Tensors xs = Start();
  const double d0 = ConsensusDistance(xs);
  std::vector<double> bytes(kW, 0);
  std::vector<std::string> errors(kW);
  std::fprintf(out, "%s,%s,0,0,1\n", topology.c_str(), method.c_str());
  int64_t step = 0;
  double d = 1, mean_bytes = 0;
  while (d >= kTarget && mean_bytes <= kMaxBytes) {
    int64_t next = step + 1;
    while (!Logged(next)) ++next;
    std::vector<std::thread> threads;
    for (int r = 0; r < kW; ++r) {
      threads.emplace_back([&, r] {
        for (int64_t s = step; s < next && errors[r].empty(); ++s) {
          auto got =
              clients[r]->Gossip(job, "x", s, xs[r], {kRows, kCols}, spec);
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
    for (int r = 0; r < kW; ++r) {
      if (!errors[r].empty()) {
        std::fprintf(stderr, "%s rank %d: %s\n", job.c_str(), r,
                     errors[r].c_str());
        return false;
      }
    }
    step = next;
    mean_bytes = std::accumulate(bytes.begin(), bytes.end(), 0.0) / kW;
    d = ConsensusDistance(xs) / d0;
    std::fprintf(out, "%s,%s,%lld,%.0f,%.6e\n", topology.c_str(),
                 method.c_str(), static_cast<long long>(step), mean_bytes, d);
  }
  std::fprintf(stderr, "%s %s: %lld steps, %.0f bytes/worker, distance %.3e\n",
               topology.c_str(), method.c_str(), static_cast<long long>(step),
               mean_bytes, d);
  return true;
}

int Main(int argc, char** argv) {
  FILE* out = argc > 1 ? std::fopen(argv[1], "w") : stdout;
  if (out == nullptr) {
    std::perror(argv[1]);
    return 1;
  }
  Cluster cluster(kW, absl::Seconds(60));
  if (absl::Status up = cluster.StartAll(); !up.ok()) {
    std::fprintf(stderr, "%s\n", up.ToString().c_str());
    return 1;
  }
  std::vector<std::unique_ptr<client::Client>> clients;
  for (int r = 0; r < kW; ++r) {
    auto client = client::Client::Connect(cluster.daemon(r).target());
    if (!client.ok()) return 1;
    clients.push_back(std::move(*client));
  }
  std::fprintf(out, "topology,method,step,bytes_per_worker,distance\n");
  for (const std::string topology : {"ring", "torus"}) {
    v1::GossipSpec exact;
    exact.set_topology(topology);
    if (!Run(clients, topology + "-exact", topology, "exact", exact, out)) {
      return 1;
    }
    for (uint32_t rank : {1u, 2u}) {
      v1::GossipSpec pg = exact;
      pg.set_rank(rank);
      pg.set_power_steps(1);
      pg.set_diffusion(1.308);  // GossipOptions' default, as in-process
      const std::string method = absl::StrCat("powergossip-r", rank);
      if (!Run(clients, topology + "-" + method, topology, method, pg, out)) {
        return 1;
      }
    }
  }
  if (out != stdout) std::fclose(out);
  return 0;
}

}  // namespace
}  // namespace gradcomp::testing

int main(int argc, char** argv) { return gradcomp::testing::Main(argc, argv); }
