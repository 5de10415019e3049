// The rules of SelectTopK (select.h) that any implementation of it follows,
// so that the CPU's and the GPU's (codecs/cuda/select.h) selections are the
// same indices for the same input: magnitude keys, the sample's size and the
// threshold's rank in it, when to filter again and how far to lower, and
// the trim of more than k candidates.
//
//   const SelectPlan plan = PlanSelection(n, k, 0.01);
//   ... threshold = the plan.rank-th largest of plan.sample keys ...
//   while (filter at threshold, AnotherPass(plan, ++passes, threshold, found,
//   k))
//     threshold = LowerThreshold(threshold);
//   if (found > k) TrimToTopK(keys_of_found, k, &indices);
#ifndef GRADCOMP_CODECS_CPU_SELECT_RULES_H_
#define GRADCOMP_CODECS_CPU_SELECT_RULES_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/types/span.h"

namespace gradcomp::codecs {

// Filtering at this key keeps exactly the nonzero magnitudes.
inline constexpr uint32_t kSmallestKey = 1;  // the smallest subnormal

// Magnitudes are compared as the bits of |x|: for non-negative floats the
// bit order is the numeric order, it is a total order (no comparator UB),
// and NaN sorts above +Inf. So a NaN is selected first: it reaches the
// average, where the daemon counts it, and leaves the state instead of
// sitting in the velocity forever.
inline uint32_t MagnitudeKey(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return bits & 0x7FFFFFFFu;
}

inline float FromMagnitudeKey(uint32_t key) {
  float x;
  std::memcpy(&x, &key, sizeof(x));
  return x;
}

// Where the first threshold comes from, for n elements and 0 < k <= n.
struct SelectPlan {
  // The threshold is exact (every key, or k == n): one pass finds the top k.
  bool exact = false;
  // How many keys the threshold is taken from: n when exact, else that many
  // stratified samples.
  size_t sample = 0;
  // The threshold is the rank-th largest (1-based) of those keys; 0 when
  // k == n (the threshold is then kSmallestKey).
  size_t rank = 0;
};
SelectPlan PlanSelection(size_t n, size_t k, double sample_fraction);

// After `passes` filter passes at `threshold` found `found` indices: whether
// to lower the threshold and filter again.
bool AnotherPass(const SelectPlan& plan, int passes, uint32_t threshold,
                 size_t found, size_t k);

// The next pass's threshold.
uint32_t LowerThreshold(uint32_t threshold);

// Keeps the k indices (of more than k, ascending) whose keys come first:
// larger key, then the lower index; still ascending. keys[j] is the key of
// (*indices)[j].
void TrimToTopK(absl::Span<const uint32_t> keys, size_t k,
                std::vector<uint32_t>* indices);

}  // namespace gradcomp::codecs

#endif  // GRADCOMP_CODECS_CPU_SELECT_RULES_H_
