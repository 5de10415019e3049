#include "codecs/cpu/select_rules.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace gradcomp::codecs {
namespace {

// The k first of (key, index) in selection order (larger key, then the
// lower index), ascending: a stable sort of the ascending indices by key.
std::vector<uint32_t> Reference(const std::vector<uint32_t>& keys,
                                const std::vector<uint32_t>& indices,
                                size_t k) {
  std::vector<size_t> order(keys.size());
  for (size_t j = 0; j < order.size(); ++j) order[j] = j;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return keys[a] > keys[b]; });
  std::vector<uint32_t> kept;
  for (size_t j = 0; j < k; ++j) kept.push_back(indices[order[j]]);
  std::sort(kept.begin(), kept.end());
  return kept;
}

TEST(TrimToTopKTest, KeepsTheKFirstWithTiesToTheLowerIndex) {
  std::mt19937 gen(5);
  for (uint32_t distinct : {1u, 3u, 50u, 1u << 30}) {
    std::uniform_int_distribution<uint32_t> key_of(1, distinct);
    std::uniform_int_distribution<uint32_t> gap(1, 9);
    for (size_t n : {2u, 7u, 1000u}) {
      std::vector<uint32_t> keys(n), indices(n);
      uint32_t index = 0;
      for (size_t j = 0; j < n; ++j) {
        keys[j] = key_of(gen);
        index += gap(gen);
        indices[j] = index;
      }
      for (size_t k : {size_t{0}, size_t{1}, n / 2, n - 1}) {
        std::vector<uint32_t> trimmed = indices;
        TrimToTopK(keys, k, &trimmed);
        EXPECT_EQ(trimmed, Reference(keys, indices, k))
            << "distinct " << distinct << " n " << n << " k " << k;
      }
    }
  }
}

}  // namespace
}  // namespace gradcomp::codecs
