#include "codecs/cpu/select_rules.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace gradcomp::codecs {
namespace {

constexpr int kMaxPasses = 10;
constexpr double kTooFew = 0.8;
constexpr float kLowerBy = 0.8f;

struct Candidate {
  uint32_t key;
  uint32_t index;
};

// The order of selection: larger magnitude first, then the lower index. It
// is total, so the k first candidates are one set however they are found.
bool Before(const Candidate& a, const Candidate& b) {
  return a.key > b.key || (a.key == b.key && a.index < b.index);
}

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

// Partitions a copy of the (key, index) pairs to find the (k+1)-th, then
// keeps what precedes it: no sort.
void TrimToTopK(absl::Span<const uint32_t> keys, size_t k,
                std::vector<uint32_t>* indices) {
  std::vector<Candidate> candidates(indices->size());
  for (size_t j = 0; j < indices->size(); ++j) {
    candidates[j] = {keys[j], (*indices)[j]};
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

}  // namespace gradcomp::codecs
