// Counts the NaN and Inf values of an fp32 tensor in host memory: the count
// the daemon takes of every input before a reduce (service/engine), and of
// a gossip round's result (service/gossip). cuda/nonfinite.h is the
// device's.
//
//   const Nonfinite n = CountNonfinite(values);
//   if (n.count > 0) ... values[n.first] ...
#ifndef GRADCOMP_CODECS_NONFINITE_H_
#define GRADCOMP_CODECS_NONFINITE_H_

#include <cstddef>
#include <cstdint>

#include "absl/types/span.h"

namespace gradcomp::codecs {

struct Nonfinite {
  uint64_t count = 0;  // values whose exponent bits are all ones
  size_t first = 0;    // the index of the first of them (0 when none)
};

Nonfinite CountNonfinite(absl::Span<const float> values);

}  // namespace gradcomp::codecs

#endif  // GRADCOMP_CODECS_NONFINITE_H_
