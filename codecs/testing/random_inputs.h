// Inputs for codec tests, drawn from std::mt19937 with a fixed seed so that
// every run (and every backend's test) sees the same values:
//
//   const std::vector<float> g = testing::Normal(1000, /*seed=*/7);
//   const std::vector<float> m = testing::LowRank(40, 70, /*rank=*/2, 3);
#ifndef GRADCOMP_CODECS_TESTING_RANDOM_INPUTS_H_
#define GRADCOMP_CODECS_TESTING_RANDOM_INPUTS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace gradcomp::codecs::testing {

// `n` draws of N(0, stddev^2).
std::vector<float> Normal(size_t n, uint32_t seed, float stddev = 1.0f);

// A row-major rows x cols matrix sum_k a_k b_k^T of `rank` pairs of normal
// factors (a from `seed`, b from `seed` + 1000): its rank is at most `rank`.
std::vector<float> LowRank(int64_t rows, int64_t cols, int rank, uint32_t seed);

}  // namespace gradcomp::codecs::testing

#endif  // GRADCOMP_CODECS_TESTING_RANDOM_INPUTS_H_
