// The compression step of Choco-Gossip (Koloskova, Stich, Jaggi, ICML 2019)
// with top-k, as GossipNode runs it in GossipOptions::Mode::kChoco: each
// round a rank sends its neighbours the k largest entries of x_i - x_hat_i
// (its model minus its public copy), k = ChocoK(fraction, n).
//
//   std::vector<uint32_t> idx;
//   TopKIndices(diff, ChocoK(0.01, diff.size()), &idx);  // ascending
//
// The selection is deterministic (ties go to the lower index), so every
// run, thread count and backend picks the same entries.
#ifndef GRADCOMP_SERVICE_GOSSIP_CHOCO_GOSSIP_H_
#define GRADCOMP_SERVICE_GOSSIP_CHOCO_GOSSIP_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace gradcomp::service {

// The number of entries a Choco message of a tensor of `n` elements carries:
// ceil(fraction * n), at least 1 and at most n, with fraction * n first
// rounded to 1e-9 so that a fraction given as k / n gives k.
int64_t ChocoK(double fraction, int64_t n);

// InvalidArgument unless `fraction` is in (0, 1].
absl::Status ValidateChocoFraction(double fraction);

// The indices of the k entries of `v` of largest magnitude, ties broken by
// the lower index, in ascending order. k must be in [0, v.size()].
void TopKIndices(absl::Span<const float> v, int64_t k,
                 std::vector<uint32_t>* indices);

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_GOSSIP_CHOCO_GOSSIP_H_
