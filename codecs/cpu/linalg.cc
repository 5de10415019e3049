#include "codecs/cpu/linalg.h"

#include <cmath>
#include <vector>

namespace gradcomp::codecs {

int OrthonormalizeColumns(absl::Span<float> a, size_t rows, size_t cols) {
  std::vector<double> m(a.begin(), a.end());
  auto at = [&](size_t i, size_t j) -> double& { return m[i * cols + j]; };
  int zero_columns = 0;
  for (size_t j = 0; j < cols; ++j) {
    for (int pass = 0; pass < 2; ++pass) {
      for (size_t k = 0; k < j; ++k) {
        double dot = 0;
        for (size_t i = 0; i < rows; ++i) dot += at(i, k) * at(i, j);
        for (size_t i = 0; i < rows; ++i) at(i, j) -= dot * at(i, k);
      }
    }
    double norm2 = 0;
    for (size_t i = 0; i < rows; ++i) norm2 += at(i, j) * at(i, j);
    if (norm2 > 0) {
      const double inv = 1.0 / std::sqrt(norm2);
      for (size_t i = 0; i < rows; ++i) at(i, j) *= inv;
    } else {
      ++zero_columns;
    }
  }
  for (size_t i = 0; i < m.size(); ++i) a[i] = static_cast<float>(m[i]);
  return zero_columns;
}

void FillGaussian(const PhiloxStream& rng, uint64_t first,
                  absl::Span<float> out) {
  constexpr double kTwoPi = 6.283185307179586;
  for (size_t j = 0; j < out.size(); ++j) {
    const uint64_t i = first + j;
    const uint64_t pair = i & ~uint64_t{1};
    // 1 - u lies in (0, 1], so the logarithm is finite.
    const double radius = std::sqrt(
        -2.0 * std::log(1.0 - static_cast<double>(rng.Uniform(pair))));
    const double angle = kTwoPi * static_cast<double>(rng.Uniform(pair + 1));
    out[j] = static_cast<float>(radius *
                                ((i & 1) ? std::sin(angle) : std::cos(angle)));
  }
}

}  // namespace gradcomp::codecs
