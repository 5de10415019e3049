#include "codecs/nonfinite.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace gradcomp::codecs {

// NaN and Inf are the floats whose exponent bits are all ones. Counted four
// lanes at a time (GCC's vector extension, SSE2) without a branch: g++ -O2
// left the isfinite loop scalar, with a branch per value, and it is a pass
// over every input. The first index is looked for only when there is one.
Nonfinite CountNonfinite(absl::Span<const float> values) {
  using U4 = uint32_t __attribute__((vector_size(16)));
  constexpr uint32_t kExponent = 0x7f800000u;
  const U4 exponent = {kExponent, kExponent, kExponent, kExponent};
  // Each lane counts at most kBlock / 4 values before it is added up.
  constexpr size_t kBlock = size_t{1} << 20;
  const size_t size = values.size();
  const size_t vector_end = size - size % 4;
  Nonfinite n;
  size_t i = 0;
  while (i < vector_end) {
    const size_t end = std::min(vector_end, i + kBlock);
    U4 lanes = {0, 0, 0, 0};
    for (; i < end; i += 4) {
      U4 bits;
      std::memcpy(&bits, values.data() + i, sizeof(bits));
      // A true comparison is all ones: -1 per non-finite lane.
      lanes -= reinterpret_cast<U4>((bits & exponent) == exponent);
    }
    n.count += uint64_t{lanes[0]} + lanes[1] + lanes[2] + lanes[3];
  }
  for (; i < size; ++i) n.count += std::isfinite(values[i]) ? 0 : 1;
  if (n.count > 0) {
    n.first = static_cast<size_t>(
        std::find_if(values.begin(), values.end(),
                     [](float v) { return !std::isfinite(v); }) -
        values.begin());
  }
  return n;
}

}  // namespace gradcomp::codecs
