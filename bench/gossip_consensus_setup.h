// The set-up shared by the two runs of PowerGossip's consensus experiment
// (bench/gossip_consensus.cc in process, bench/gossip_consensus_daemons.cc
// through real daemons), so that their curves compare step for step: the
// same world, matrices, starting values, stopping rule and logged steps.
// Two kinds of data, as in the paper's consensus experiment: independent
// standard normal matrices (full rank, a flat spectrum) and images (a
// decaying spectrum, like the paper's faces): Fashion-MNIST, a 2 x 2 tile of
// four 28 x 28 images per worker.
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

enum class Data { kRandom, kFashionMnist };
inline constexpr Data kData[] = {Data::kRandom, Data::kFashionMnist};

// "random" or "fashion-mnist", the CSV's data column.
std::string DataName(Data data);

// Every rank's starting kRows x kCols matrix, row-major: standard normal
// with a fixed seed (StartRandom), or rank i's tile of Fashion-MNIST
// training images 4i..4i+3 (pixels / 255). NotFound naming the file and the
// package when the images are missing; DataLoss when the file is not an
// IDX image file.
absl::StatusOr<std::vector<std::vector<float>>> Start(Data data);

// Every rank's rows x cols standard normal matrix, row-major, from a fixed
// seed: Start(Data::kRandom) at kRows x kCols (seed 1), or the paper's
// 100 x 100; other seeds for the spread over starts.
std::vector<std::vector<float>> StartRandom(int rows, int cols,
                                            uint32_t seed = 1);

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
};

// Exact gossip at diffusion 1 and tuned; PowerGossip r = 1 and 2 at the
// paper's 1.308 and tuned, and r = 4 and 8 tuned; Choco top-k with k = r (rows
// + cols) / 4 (PowerGossip rank r's bytes per step) for r = 1 and 2, and k = 5
// % of the entries.
std::vector<Method> Methods(int rows, int cols);

// Every step of the first 50, then about 50 steps per decade.
inline bool Logged(int64_t step) {
  return step < 50 || step % std::max<int64_t>(1, step / 50) == 0;
}

}  // namespace gradcomp::bench

#endif  // GRADCOMP_BENCH_GOSSIP_CONSENSUS_SETUP_H_
