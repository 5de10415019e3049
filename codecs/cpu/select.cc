#include "codecs/cpu/select.h"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

#include "codecs/cpu/parallel.h"
#include "codecs/cpu/select_rules.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define GC_SELECT_X86 1
#endif

namespace gradcomp::codecs {
namespace {

// Elements tested together: a block without a hit costs a few vector
// compares and one branch.
constexpr size_t kBlock = 16;

std::atomic<bool> simd_disabled{false};

// Keys are below 2^31, so key >= threshold is the signed compare key >
// threshold - 1 that SSE2 and AVX2 have, for every threshold up to 2^31.
int32_t Below(uint32_t threshold) {
  return static_cast<int32_t>(std::min(threshold, uint32_t{1} << 31) - 1);
}

// Writes i + j for each set bit j of `hits` (nonzero) at (*out)[*count],
// growing `out` as needed; out->size() is its capacity until FinishRange.
inline void AppendHits(uint32_t hits, size_t i, std::vector<uint32_t>* out,
                       size_t* count) {
  if (out->size() < *count + kBlock) out->resize(2 * (*count + kBlock));
  uint32_t* o = out->data() + *count;
  do {
    *o++ = static_cast<uint32_t>(i) + __builtin_ctz(hits);
    hits &= hits - 1;
  } while (hits != 0);
  *count = static_cast<size_t>(o - out->data());
}

// The tail [i, end) one by one, after the `count` indices of the blocks.
void FinishRange(const float* x, size_t i, size_t end, uint32_t threshold,
                 size_t count, std::vector<uint32_t>* out) {
  out->resize(count);
  for (; i < end; ++i) {
    if (MagnitudeKey(x[i]) >= threshold)
      out->push_back(static_cast<uint32_t>(i));
  }
}

// Appends every i in [begin, end) with MagnitudeKey(x[i]) >= threshold.
//
// Sixteen keys at a time into a 16-bit mask of hits, whose set bits are then
// written out: the plain loop compiled to four scalar instructions per
// element, and this pass over the whole tensor took twice as long as
// reading it (docs/benchmarks.md, "Top-k selection and threads kept"). This
// one uses GCC's vector extension (SSE2, every x86-64).
void FilterRangeSse2(const float* x, size_t begin, size_t end,
                     uint32_t threshold, std::vector<uint32_t>* out) {
  using I4 = int32_t __attribute__((vector_size(16)));
  const int32_t below = Below(threshold);
  const I4 bound = {below, below, below, below};
  const I4 magnitude = {0x7FFFFFFF, 0x7FFFFFFF, 0x7FFFFFFF, 0x7FFFFFFF};
  size_t count = out->size();
  size_t i = begin;
  for (; i + kBlock <= end; i += kBlock) {
    I4 lanes = {0, 0, 0, 0};
    for (int j = 0; j < static_cast<int>(kBlock); j += 4) {
      I4 bits;
      std::memcpy(&bits, x + i + j, sizeof(bits));
      // A true comparison is all ones: keep the lane's bit of the mask.
      const I4 bit = {1 << j, 2 << j, 4 << j, 8 << j};
      lanes |= ((bits & magnitude) > bound) & bit;
    }
    const uint32_t hits =
        static_cast<uint32_t>(lanes[0] | lanes[1] | lanes[2] | lanes[3]);
    if (hits != 0) AppendHits(hits, i, out, &count);
  }
  FinishRange(x, i, end, threshold, count, out);
}

#ifdef GC_SELECT_X86
// FilterRangeSse2 with two 8-lane compares and movmskps for the mask: 30 %
// faster on a tensor out of cache (docs/benchmarks.md, "Top-k selection and
// threads kept").
__attribute__((target("avx2"))) void FilterRangeAvx2(
    const float* x, size_t begin, size_t end, uint32_t threshold,
    std::vector<uint32_t>* out) {
  const __m256i bound = _mm256_set1_epi32(Below(threshold));
  const __m256i magnitude = _mm256_set1_epi32(0x7FFFFFFF);
  size_t count = out->size();
  size_t i = begin;
  for (; i + kBlock <= end; i += kBlock) {
    const __m256i low = _mm256_and_si256(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)), magnitude);
    const __m256i high = _mm256_and_si256(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i + 8)),
        magnitude);
    const uint32_t hits =
        static_cast<uint32_t>(_mm256_movemask_ps(
            _mm256_castsi256_ps(_mm256_cmpgt_epi32(low, bound)))) |
        (static_cast<uint32_t>(_mm256_movemask_ps(
             _mm256_castsi256_ps(_mm256_cmpgt_epi32(high, bound))))
         << 8);
    if (hits != 0) AppendHits(hits, i, out, &count);
  }
  FinishRange(x, i, end, threshold, count, out);
}

bool UseAvx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has && !simd_disabled.load(std::memory_order_relaxed);
}
#endif  // GC_SELECT_X86

void FilterRange(const float* x, size_t begin, size_t end, uint32_t threshold,
                 std::vector<uint32_t>* out) {
#ifdef GC_SELECT_X86
  if (UseAvx2()) {
    FilterRangeAvx2(x, begin, end, threshold, out);
    return;
  }
#endif
  FilterRangeSse2(x, begin, end, threshold, out);
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

bool SelectSimdActive() {
#ifdef GC_SELECT_X86
  return UseAvx2();
#else
  return false;
#endif
}

void DisableSelectSimdForTesting(bool disable) {
  simd_disabled.store(disable, std::memory_order_relaxed);
}

}  // namespace gradcomp::codecs
