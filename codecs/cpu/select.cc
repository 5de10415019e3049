#include "codecs/cpu/select.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "codecs/cpu/parallel.h"
#include "codecs/cpu/select_rules.h"

namespace gradcomp::codecs {
namespace {

// Elements tested together: a block without a hit costs one vector compare
// per few elements and no branch per element.
constexpr size_t kBlock = 16;

void FilterRange(const float* x, size_t begin, size_t end, uint32_t threshold,
                 std::vector<uint32_t>* out) {
  size_t i = begin;
  for (; i + kBlock <= end; i += kBlock) {
    int any = 0;
    for (size_t j = 0; j < kBlock; ++j)
      any |= MagnitudeKey(x[i + j]) >= threshold;
    if (!any) continue;
    for (size_t j = 0; j < kBlock; ++j) {
      if (MagnitudeKey(x[i + j]) >= threshold) {
        out->push_back(static_cast<uint32_t>(i + j));
      }
    }
  }
  for (; i < end; ++i) {
    if (MagnitudeKey(x[i]) >= threshold)
      out->push_back(static_cast<uint32_t>(i));
  }
}

// Every i with MagnitudeKey(x[i]) >= threshold, ascending.
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
        keys[j] = MagnitudeKey(x[positions[j - b0]]);
      }
    }
  });
  return keys;
}

// The keys of the `indices` of x.
std::vector<uint32_t> KeysAt(absl::Span<const float> x,
                             const std::vector<uint32_t>& indices) {
  std::vector<uint32_t> keys(indices.size());
  for (size_t j = 0; j < indices.size(); ++j)
    keys[j] = MagnitudeKey(x[indices[j]]);
  return keys;
}

}  // namespace

TopKSelection SelectTopK(absl::Span<const float> x, size_t k,
                         double sample_fraction, const PhiloxStream& rng) {
  TopKSelection result;
  const size_t n = x.size();
  if (n == 0 || k == 0) return result;
  k = std::min(k, n);

  const SelectPlan plan = PlanSelection(n, k, sample_fraction);
  uint32_t threshold = kSmallestKey;
  if (plan.rank > 0) {
    std::vector<uint32_t> keys;
    if (plan.exact) {
      keys.resize(n);
      for (size_t i = 0; i < n; ++i) keys[i] = MagnitudeKey(x[i]);
    } else {
      keys = StratifiedSample(x, plan.sample, rng);
    }
    threshold = NthLargest(keys, plan.rank - 1);
  }
  result.sample_size = plan.sample;
  threshold = std::max(threshold, kSmallestKey);

  while (true) {
    result.indices = Filter(x, threshold);
    ++result.passes;
    if (!AnotherPass(plan, result.passes, threshold, result.indices.size(),
                     k)) {
      break;
    }
    threshold = LowerThreshold(threshold);
  }
  result.threshold = FromMagnitudeKey(threshold);
  if (result.indices.size() > k) {
    TrimToTopK(KeysAt(x, result.indices), k, &result.indices);
  }
  return result;
}

}  // namespace gradcomp::codecs
