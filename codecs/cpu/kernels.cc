#include "codecs/cpu/kernels.h"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

namespace gradcomp::codecs {
namespace {

constexpr size_t kLanes = 8;

// Adds the squares of x[0, n) (n a multiple of kLanes) into lane sums.
inline void AccumulateLanes(const float* x, size_t n, float lanes[kLanes]) {
  for (size_t i = 0; i < n; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) lanes[j] += x[i + j] * x[i + j];
  }
}

// Sum of x[i]^2 in double, in index order: each square is exact (48
// significant bits), at most about 1.2e77 and at least about 2e-90, so no
// finite input overflows or underflows it. The slow path of the fp32 sums,
// taken only where they overflow or are tiny.
double DoubleSumOfSquares(absl::Span<const float> x) {
  double total = 0;
  for (float v : x) total += static_cast<double>(v) * v;
  return total;
}

}  // namespace

double SumOfSquares(absl::Span<const float> x) {
  constexpr size_t kBlock = 256;
  const size_t blocked = x.size() - x.size() % kBlock;
  double total = 0;
  for (size_t b = 0; b < blocked; b += kBlock) {
    float lanes[kLanes] = {};
    AccumulateLanes(x.data() + b, kBlock, lanes);
    for (size_t j = 0; j < kLanes; ++j) total += lanes[j];
  }
  for (size_t i = blocked; i < x.size(); ++i) {
    total += static_cast<double>(x[i]) * x[i];
  }
  // Not finite: x holds NaN or Inf (the double sum is then too), or an fp32
  // lane overflowed on finite values. Tiny: squares may have underflowed.
  if (!(std::isfinite(total) && total >= kTinySumOfSquares)) {
    return DoubleSumOfSquares(x);
  }
  return total;
}

float BucketSumOfSquares(absl::Span<const float> x) {
  const size_t laned = x.size() - x.size() % kLanes;
  float lanes[kLanes] = {};
  AccumulateLanes(x.data(), laned, lanes);
  float total = 0;
  for (size_t j = 0; j < kLanes; ++j) total += lanes[j];
  for (size_t i = laned; i < x.size(); ++i) total += x[i] * x[i];
  return total;
}

float BucketNorm(absl::Span<const float> x) {
  const float sum = BucketSumOfSquares(x);
  if (std::isfinite(sum) && sum >= kTinySumOfSquares) return std::sqrt(sum);
  // A bucket of zeros (common: sparse gradients) skips the slow double sum.
  bool nonzero = false;
  for (float v : x) nonzero |= v != 0;
  if (!nonzero) return 0;
  return static_cast<float>(std::sqrt(DoubleSumOfSquares(x)));
}

bool AllFinite(absl::Span<const float> x) {
  bool finite = true;
  for (float v : x) finite &= std::fabs(v) <= std::numeric_limits<float>::max();
  return finite;
}

PhiloxStream WorkerStream(const StepContext& ctx, uint32_t round) {
  // An odd 64-bit constant (2^64 / golden ratio) spreads ranks over the seed
  // space; rank r + 1 so that rank 0 also differs from the shared stream.
  constexpr uint64_t kRankMix = 0x9E3779B97F4A7C15ull;
  const uint64_t seed =
      ctx.seed ^ (kRankMix * (static_cast<uint64_t>(ctx.rank) + 1));
  return PhiloxStream(seed, ctx.tensor_id, ctx.step, round);
}

}  // namespace gradcomp::codecs
