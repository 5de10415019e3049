#include "codecs/cpu/select_rules.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

namespace gradcomp::codecs {
namespace {

constexpr int kMaxPasses = 10;
constexpr double kTooFew = 0.8;
constexpr float kLowerBy = 0.8f;

}  // namespace

SelectPlan PlanSelection(size_t n, size_t k, double sample_fraction) {
  SelectPlan plan;
  const double wanted = std::max(
      std::ceil(sample_fraction * static_cast<double>(n)),
      std::ceil(2.0 * static_cast<double>(n) / static_cast<double>(k)));
  plan.exact = k == n || wanted >= static_cast<double>(n);
  if (k == n) {
    plan.sample = n;
  } else if (plan.exact) {
    plan.sample = n;
    plan.rank = k;
  } else {
    plan.sample = static_cast<size_t>(wanted);
    plan.rank = std::min<size_t>(
        plan.sample, (static_cast<uint64_t>(k) * plan.sample + n - 1) / n);
  }
  return plan;
}

bool AnotherPass(const SelectPlan& plan, int passes, uint32_t threshold,
                 size_t found, size_t k) {
  // An exact threshold finds at least k unless fewer are nonzero, and then
  // a lower one finds no more.
  return !(plan.exact || passes == kMaxPasses || threshold == kSmallestKey ||
           static_cast<double>(found) >= kTooFew * static_cast<double>(k));
}

uint32_t LowerThreshold(uint32_t threshold) {
  // Infinite or NaN thresholds (a sample full of them) step down from the
  // largest finite magnitude.
  const float current = FromMagnitudeKey(threshold);
  const float lowered =
      (std::isfinite(current) ? current : std::numeric_limits<float>::max()) *
      kLowerBy;
  return std::max(MagnitudeKey(lowered), kSmallestKey);
}

// The order of selection is larger key first, then the lower index: the
// k first are every key above the k-th largest key and, of the keys equal
// to it, the first ones in `indices`' (ascending) order. So a partition of
// a copy of the keys alone finds that key, with no (key, index) pairs to
// sort.
void TrimToTopK(absl::Span<const uint32_t> keys, size_t k,
                std::vector<uint32_t>* indices) {
  if (k == 0) {
    indices->clear();
    return;
  }
  std::vector<uint32_t> partitioned(keys.begin(), keys.end());
  std::nth_element(partitioned.begin(), partitioned.begin() + (k - 1),
                   partitioned.end(), std::greater<uint32_t>());
  const uint32_t last = partitioned[k - 1];
  size_t above = 0;
  for (const uint32_t key : keys) above += key > last;
  size_t ties = k - above;  // keys equal to `last` that are kept
  size_t kept = 0;
  for (size_t j = 0; j < keys.size(); ++j) {
    if (keys[j] > last || (keys[j] == last && ties > 0)) {
      if (keys[j] == last) --ties;
      (*indices)[kept++] = (*indices)[j];
    }
  }
  indices->resize(kept);
}

}  // namespace gradcomp::codecs
