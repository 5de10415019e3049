#include "service/gossip/choco_gossip.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace gradcomp::service {

int64_t ChocoK(double fraction, int64_t n) {
  const double exact =
      std::round(fraction * static_cast<double>(n) * 1e9) / 1e9;
  const int64_t k = static_cast<int64_t>(std::ceil(exact));
  return std::clamp<int64_t>(k, std::min<int64_t>(1, n), n);
}

absl::Status ValidateChocoFraction(double fraction) {
  if (!(fraction > 0 && fraction <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("Choco-Gossip top-k fraction ", fraction,
                     " is not in (0, 1]: it is the share of a tensor's "
                     "entries sent per edge and round"));
  }
  return absl::OkStatus();
}

void TopKIndices(absl::Span<const float> v, int64_t k,
                 std::vector<uint32_t>* indices) {
  indices->resize(v.size());
  std::iota(indices->begin(), indices->end(), 0u);
  // A strict total order, so the chosen set does not depend on the
  // algorithm's visiting order; NaN counts as the largest magnitude.
  auto magnitude = [&v](uint32_t i) {
    return std::isnan(v[i]) ? INFINITY : std::fabs(v[i]);
  };
  auto before = [&magnitude](uint32_t a, uint32_t b) {
    const float fa = magnitude(a);
    const float fb = magnitude(b);
    return fa > fb || (fa == fb && a < b);
  };
  if (k < static_cast<int64_t>(v.size())) {
    std::nth_element(indices->begin(), indices->begin() + k, indices->end(),
                     before);
  }
  indices->resize(k);
  std::sort(indices->begin(), indices->end());
}

}  // namespace gradcomp::service
