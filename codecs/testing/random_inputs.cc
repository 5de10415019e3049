#include "codecs/testing/random_inputs.h"

#include <random>

namespace gradcomp::codecs::testing {

std::vector<float> Normal(size_t n, uint32_t seed, float stddev) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

std::vector<float> LowRank(int64_t rows, int64_t cols, int rank,
                           uint32_t seed) {
  const std::vector<float> a = Normal(rows * rank, seed);
  const std::vector<float> b = Normal(cols * rank, seed + 1000);
  std::vector<float> m(rows * cols, 0.0f);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      for (int k = 0; k < rank; ++k) {
        m[i * cols + j] += a[i * rank + k] * b[j * rank + k];
      }
    }
  }
  return m;
}

}  // namespace gradcomp::codecs::testing
