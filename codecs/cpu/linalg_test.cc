#include "codecs/cpu/linalg.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace gradcomp::codecs {
namespace {

double Dot(const std::vector<float>& a, size_t rows, size_t cols, size_t j,
           size_t k) {
  double s = 0;
  for (size_t i = 0; i < rows; ++i) {
    s += static_cast<double>(a[i * cols + j]) * a[i * cols + k];
  }
  return s;
}

TEST(OrthonormalizeColumnsTest,
     GivesOrthonormalColumnsWithTheSameLeadingSpans) {
  constexpr size_t kRows = 50, kCols = 4;
  std::mt19937 gen(1);
  std::normal_distribution<float> normal;
  std::vector<float> a(kRows * kCols);
  for (float& x : a) x = normal(gen);
  const std::vector<float> original = a;
  EXPECT_EQ(OrthonormalizeColumns(absl::MakeSpan(a), kRows, kCols), 0);
  for (size_t j = 0; j < kCols; ++j) {
    for (size_t k = 0; k < kCols; ++k) {
      EXPECT_NEAR(Dot(a, kRows, kCols, j, k), j == k ? 1.0 : 0.0, 1e-6);
    }
  }
  // Gram-Schmidt: column j of the input lies in the span of output columns
  // 0..j, with a positive coefficient on column j.
  for (size_t j = 0; j < kCols; ++j) {
    std::vector<double> residual(kRows);
    for (size_t i = 0; i < kRows; ++i) residual[i] = original[i * kCols + j];
    double diagonal = 0;
    for (size_t k = 0; k <= j; ++k) {
      double c = 0;
      for (size_t i = 0; i < kRows; ++i) c += residual[i] * a[i * kCols + k];
      for (size_t i = 0; i < kRows; ++i) residual[i] -= c * a[i * kCols + k];
      if (k == j) diagonal = c;
    }
    double norm = 0;
    for (double r : residual) norm += r * r;
    EXPECT_LT(std::sqrt(norm), 1e-5) << j;
    EXPECT_GT(diagonal, 0) << j;
  }
}

TEST(OrthonormalizeColumnsTest,
     DependentColumnsStayOrthogonalAndZerosStayZero) {
  // Column 2 = column 0 + column 1 exactly (small integers): its residual is
  // rounding noise of the projections, which one pass would leave far from
  // orthogonal to columns 0 and 1. The second pass makes it orthogonal (or
  // exactly zero, when the noise cancels). Column 3 is zero and stays so.
  constexpr size_t kRows = 64, kCols = 4;
  std::mt19937 gen(2);
  std::uniform_int_distribution<int> small(-8, 8);
  std::vector<float> a(kRows * kCols);
  for (size_t i = 0; i < kRows; ++i) {
    a[i * kCols] = static_cast<float>(small(gen));
    a[i * kCols + 1] = static_cast<float>(small(gen));
    a[i * kCols + 2] = a[i * kCols] + a[i * kCols + 1];
    a[i * kCols + 3] = 0.0f;
  }
  const int zeros = OrthonormalizeColumns(absl::MakeSpan(a), kRows, kCols);
  EXPECT_GE(zeros, 1);
  for (size_t j = 0; j < 2; ++j) {
    EXPECT_NEAR(Dot(a, kRows, kCols, j, j), 1.0, 1e-6);
    EXPECT_NEAR(Dot(a, kRows, kCols, j, 2), 0.0, 1e-6);
  }
  for (size_t i = 0; i < kRows; ++i) EXPECT_EQ(a[i * kCols + 3], 0.0f);
}

TEST(FillGaussianTest, StandardNormalMomentsAndIndexAddressable) {
  const PhiloxStream rng(7, 8, 9, 0);
  std::vector<float> x(200000);
  FillGaussian(rng, 0, absl::MakeSpan(x));
  double sum = 0, sum2 = 0, sum4 = 0;
  for (float v : x) {
    ASSERT_TRUE(std::isfinite(v));
    sum += v;
    sum2 += static_cast<double>(v) * v;
    sum4 += static_cast<double>(v) * v * v * v;
  }
  const double n = static_cast<double>(x.size());
  // Standard errors: mean 1/sqrt(n) = 0.0022, variance sqrt(2/n) = 0.0032,
  // fourth moment sqrt(96/n) = 0.022; bounds at about 5 of them.
  EXPECT_NEAR(sum / n, 0.0, 0.011);
  EXPECT_NEAR(sum2 / n, 1.0, 0.016);
  EXPECT_NEAR(sum4 / n, 3.0, 0.11);
  // Element i does not depend on where the fill started.
  std::vector<float> tail(5);
  FillGaussian(rng, 1001, absl::MakeSpan(tail));
  for (size_t j = 0; j < tail.size(); ++j) EXPECT_EQ(tail[j], x[1001 + j]);
}

}  // namespace
}  // namespace gradcomp::codecs
