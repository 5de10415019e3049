// The set-up shared by the two runs of PowerGossip's consensus experiment
// (bench/gossip_consensus.cc in process, bench/gossip_consensus_daemons.cc
// through real daemons), so that their curves compare step for step: the
// same world, matrices, starting values, stopping rule and logged steps.
#ifndef GRADCOMP_BENCH_GOSSIP_CONSENSUS_SETUP_H_
#define GRADCOMP_BENCH_GOSSIP_CONSENSUS_SETUP_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace gradcomp::bench {

inline constexpr int kW = 8;
inline constexpr int kRows = 64;
inline constexpr int kCols = 64;
inline constexpr size_t kN = kRows * kCols;
// Stop at this relative distance or this many bytes per worker.
inline constexpr double kTarget = 1e-6;
inline constexpr double kMaxBytes = 8e6;

// Every rank's starting kRows x kCols matrix, standard normal, fixed seed.
inline std::vector<std::vector<float>> Start() {
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  std::vector<std::vector<float>> xs(kW, std::vector<float>(kN));
  for (auto& x : xs) {
    for (float& v : x) v = normal(rng);
  }
  return xs;
}

// Every step of the first 50, then about 50 steps per decade.
inline bool Logged(int64_t step) {
  return step < 50 || step % std::max<int64_t>(1, step / 50) == 0;
}

}  // namespace gradcomp::bench

#endif  // GRADCOMP_BENCH_GOSSIP_CONSENSUS_SETUP_H_
