#include "codecs/cpu/select.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#include "codecs/cpu/parallel.h"

namespace gradcomp::codecs {
namespace {

constexpr int kMaxPasses = 10;
constexpr double kTooFew = 0.8;
constexpr float kLowerBy = 0.8f;
// Filtering at this key keeps exactly the nonzero magnitudes.
constexpr uint32_t kSmallestKey = 1;  // the smallest subnormal
// Elements tested together: a block without a hit costs one vector compare
// per few elements and no branch per element.
constexpr size_t kBlock = 16;

// Magnitudes are compared as the bits of |x|: for non-negative floats the
// bit order is the numeric order, it is a total order (no comparator UB),
// and NaN sorts above +Inf. So a NaN is selected first: it reaches the
// average, where the daemon counts it, and leaves the state instead of
// sitting in the velocity forever.
inline uint32_t Key(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return bits & 0x7FFFFFFFu;
}

inline float FromKey(uint32_t key) {
  float x;
  std::memcpy(&x, &key, sizeof(x));
  return x;
}

void FilterRange(const float* x, size_t begin, size_t end, uint32_t threshold,
                 std::vector<uint32_t>* out) {
  size_t i = begin;
  for (; i + kBlock <= end; i += kBlock) {
    int any = 0;
    for (size_t j = 0; j < kBlock; ++j) any |= Key(x[i + j]) >= threshold;
    if (!any) continue;
    for (size_t j = 0; j < kBlock; ++j) {
      if (Key(x[i + j]) >= threshold) {
        out->push_back(static_cast<uint32_t>(i + j));
      }
    }
  }
  for (; i < end; ++i) {
    if (Key(x[i]) >= threshold) out->push_back(static_cast<uint32_t>(i));
  }
}

// Every i with Key(x[i]) >= threshold, ascending.
std::vector<uint32_t> Filter(absl::Span<const float> x, uint32_t threshold) {
  const ParallelOptions options{/*min_per_part=*/size_t{1} << 20,
                                /*align=*/kBlock};
  std::vector<std::vector<uint32_t>> found(ParallelParts(x.size(), options));
  ParallelFor(x.size(), options, [&](size_t begin, size_t end, int part) {
    FilterRange(x.data(), begin, end, threshold, &found[part]);
  });
  if (found.size() == 1) return std::move(found[0]);
  size_t total = 0;
  for (const auto& f : found) total += f.size();
  std::vector<uint32_t> all;
  all.reserve(total);
  for (const auto& f : found) all.insert(all.end(), f.begin(), f.end());
  return all;
}

// The rank-th largest (0-based) of `keys`, which it reorders.
uint32_t NthLargest(std::vector<uint32_t>& keys, size_t rank) {
  std::nth_element(keys.begin(), keys.begin() + rank, keys.end(),
                   std::greater<uint32_t>());
  return keys[rank];
}

// One magnitude key from each of `count` equal strata of x, at a Philox-chosen
// offset within the stratum. The reads are cache misses by design (one per
// stratum): positions are drawn a batch ahead so that the loads of a batch
// are independent and overlap, and large samples are split across threads.
std::vector<uint32_t> StratifiedSample(absl::Span<const float> x, size_t count,
                                       const PhiloxStream& rng) {
  constexpr size_t kBatch = 256;  // a multiple of the 4 words of a block
  const uint64_t n = x.size();
  std::vector<uint32_t> keys(count);
  const ParallelOptions options{/*min_per_part=*/size_t{1} << 16,
                                /*align=*/kBatch};
  ParallelFor(count, options, [&](size_t begin, size_t end, int) {
    uint64_t positions[kBatch];
    for (size_t b0 = begin; b0 < end; b0 += kBatch) {
      const size_t b1 = std::min(b0 + kBatch, end);
      uint64_t words[4];
      for (uint64_t j = b0; j < b1; ++j) {
        if (j % 4 == 0) rng.Block(j / 4, words);
        const uint64_t first = j * n / count;
        const uint64_t width = (j + 1) * n / count - first;
        positions[j - b0] = first + words[j % 4] % width;
      }
      for (size_t j = b0; j < b1; ++j) {
        keys[j] = Key(x[positions[j - b0]]);
      }
    }
  });
  return keys;
}

struct Candidate {
  uint32_t key;
  uint32_t index;
};

// The order of selection: larger magnitude first, then the lower index.
bool Before(const Candidate& a, const Candidate& b) {
  return a.key > b.key || (a.key == b.key && a.index < b.index);
}

// Keeps the k indices (of more than k, ascending) that come first in Before
// order, still ascending. Partitions a copy of (magnitude, index) pairs to
// find the (k+1)-th, then keeps what precedes it: no sort, and x is read once
// at the candidates.
void TrimToTopK(absl::Span<const float> x, size_t k,
                std::vector<uint32_t>* indices) {
  std::vector<Candidate> candidates(indices->size());
  for (size_t j = 0; j < indices->size(); ++j) {
    const uint32_t i = (*indices)[j];
    candidates[j] = {Key(x[i]), i};
  }
  std::vector<Candidate> partitioned = candidates;
  std::nth_element(partitioned.begin(), partitioned.begin() + k,
                   partitioned.end(), Before);
  const Candidate first_dropped = partitioned[k];
  indices->clear();
  for (const Candidate& c : candidates) {
    if (Before(c, first_dropped)) indices->push_back(c.index);
  }
}

}  // namespace

TopKSelection SelectTopK(absl::Span<const float> x, size_t k,
                         double sample_fraction, const PhiloxStream& rng) {
  TopKSelection result;
  const size_t n = x.size();
  if (n == 0 || k == 0) return result;
  k = std::min(k, n);

  const double wanted = std::max(
      std::ceil(sample_fraction * static_cast<double>(n)),
      std::ceil(2.0 * static_cast<double>(n) / static_cast<double>(k)));
  const bool exact = k == n || wanted >= static_cast<double>(n);
  uint32_t threshold;
  if (k == n) {
    threshold = kSmallestKey;
    result.sample_size = n;
  } else if (exact) {
    std::vector<uint32_t> keys(n);
    for (size_t i = 0; i < n; ++i) keys[i] = Key(x[i]);
    threshold = NthLargest(keys, k - 1);
    result.sample_size = n;
  } else {
    const size_t count = static_cast<size_t>(wanted);
    std::vector<uint32_t> keys = StratifiedSample(x, count, rng);
    const size_t rank =
        std::min<size_t>(count, (static_cast<uint64_t>(k) * count + n - 1) / n);
    threshold = NthLargest(keys, rank - 1);
    result.sample_size = count;
  }
  threshold = std::max(threshold, kSmallestKey);

  while (true) {
    result.indices = Filter(x, threshold);
    ++result.passes;
    // An exact threshold finds at least k unless fewer are nonzero, and then
    // a lower one finds no more.
    if (exact || result.passes == kMaxPasses || threshold == kSmallestKey ||
        static_cast<double>(result.indices.size()) >=
            kTooFew * static_cast<double>(k)) {
      break;
    }
    // Infinite or NaN thresholds (a sample full of them) step down from the
    // largest finite magnitude.
    const float current = FromKey(threshold);
    const float lowered =
        (std::isfinite(current) ? current : std::numeric_limits<float>::max()) *
        kLowerBy;
    threshold = std::max(Key(lowered), kSmallestKey);
  }
  result.threshold = FromKey(threshold);
  if (result.indices.size() > k) TrimToTopK(x, k, &result.indices);
  return result;
}

}  // namespace gradcomp::codecs
