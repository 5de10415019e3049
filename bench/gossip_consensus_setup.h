// The set-up shared by the two runs of PowerGossip's consensus experiment
// (bench/gossip_consensus.cc in process, bench/gossip_consensus_daemons.cc
// through real daemons), so that their curves compare step for step: the
// same world, matrices, starting values, stopping rule and logged steps.
// Three kinds of data: as in the paper's consensus experiment, independent
// standard normal matrices (full rank, a flat spectrum) and images (a
// decaying spectrum, like the paper's faces): Fashion-MNIST, a 2 x 2 tile of
// four 28 x 28 images per worker; and what the product gossips, trained
// model weights: one 56 x 56 layer of 8 MLPs trained from one
// initialisation on disjoint shards (bench/gossip_weights.py writes them).
#ifndef GRADCOMP_BENCH_GOSSIP_CONSENSUS_SETUP_H_
#define GRADCOMP_BENCH_GOSSIP_CONSENSUS_SETUP_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace gradcomp::bench {

inline constexpr int kW = 8;
inline constexpr int kRows = 56;
inline constexpr int kCols = 56;
inline constexpr size_t kN = kRows * kCols;
// Stop at this relative distance or this many bytes per worker.
inline constexpr double kTarget = 1e-6;
inline constexpr double kMaxBytes = 8e6;
// A run whose relative distance passes this has diverged: it stops.
inline constexpr double kDiverged = 1e3;

// The Debian package dataset-fashion-mnist's training images.
inline constexpr char kFashionMnistImages[] =
    "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz";

// Where bench/gossip_weights.py writes the trained weights by default.
inline constexpr char kWeightsFile[] = "/tmp/gossip_consensus_weights.bin";

enum class Data { kRandom, kFashionMnist, kWeights };
inline constexpr Data kData[] = {Data::kRandom, Data::kFashionMnist,
                                 Data::kWeights};

// "random", "fashion-mnist" or "weights", the CSV's data column.
std::string DataName(Data data);
// The Data named `name`; InvalidArgument naming the three otherwise.
absl::StatusOr<Data> ParseData(const std::string& name);

// Each of `workers` ranks' starting kRows x kCols matrix, row-major:
// standard normal with a fixed seed (StartRandom), rank i's tile of
// Fashion-MNIST training images 4i..4i+3 (pixels / 255), or worker i's
// trained layer read from `weights_file`. NotFound naming the file and the
// package (images) or the command that writes it (weights) when it is
// missing; DataLoss when the file is not what it should be (another
// worker count or shape included).
absl::StatusOr<std::vector<std::vector<float>>> Start(
    Data data, const std::string& weights_file = kWeightsFile,
    int workers = kW);

// Every one of `workers` ranks' rows x cols standard normal matrix,
// row-major, from a fixed seed: Start(Data::kRandom) at kRows x kCols
// (seed 1), or the paper's 100 x 100; other seeds for the spread over
// starts, other worker counts for rings of another size.
std::vector<std::vector<float>> StartRandom(int rows, int cols,
                                            uint32_t seed = 1,
                                            int workers = kW);

// One compared method; every step size is tuned by the same rule
// (gossip_consensus.cc, Tune) except PowerGossip's fixed-diffusion rows.
struct Method {
  enum class Kind { kExact, kPowerGossip, kChoco };
  Kind kind;
  std::string name;    // the CSV's method column
  int rank = 0;        // kPowerGossip
  int k = 0;           // kChoco: entries sent per neighbour and step
  bool tuned = true;   // false: the default diffusion (1.308, exact: 1)
  int iterations = 1;  // kPowerGossip: power steps per round
  // kPowerGossip: false restarts every edge's factors each round (the
  // daemon's GossipSpec.fresh_factors).
  bool warm_start = true;
};

// Exact gossip at diffusion 1 and tuned; PowerGossip r = 1 and 2 at the
// paper's 1.308 and tuned, and r = 4 and 8 tuned; Choco top-k with k = r (rows
// + cols) / 4 (PowerGossip rank r's bytes per step) for r = 1 and 2, and k = 5
// % of the entries.
std::vector<Method> Methods(int rows, int cols);
// Methods and PowerGossip r = 1 and 2 without warm start, tuned
// ("powergossip-r<r>-cold-tuned"), which run only when named.
std::vector<Method> AllMethods(int rows, int cols);

// Every step of the first 50, then about 50 steps per decade.
inline bool Logged(int64_t step) {
  return step < 50 || step % std::max<int64_t>(1, step / 50) == 0;
}

}  // namespace gradcomp::bench

#endif  // GRADCOMP_BENCH_GOSSIP_CONSENSUS_SETUP_H_
