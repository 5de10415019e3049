// Sign bits of fp32 vectors, 64 to a little-endian 64-bit word, for the
// 1-bit codecs (signsgd, efsign, signum, onebit).
//
//   Bytes body(SignBytes(n), '\0');
//   const double l1 = PackSigns(x, body.data());   // also returns sum |x|
//   AddSigns(body.data(), /*pos=*/s, /*neg=*/-s, acc);  // acc += s * sign
//
// Bit i % 64 of word i / 64 is 1 when x[i] < 0: +0, -0 and NaN give 0 ("+1"),
// so a zero never becomes a negative step. Padding bits of the last word are 0.
#ifndef GRADCOMP_CODECS_CPU_BITPACK_H_
#define GRADCOMP_CODECS_CPU_BITPACK_H_

#include <cstddef>
#include <cstdint>

#include "absl/types/span.h"

namespace gradcomp::codecs {

// Bytes of the packed signs of n values: whole 64-bit words.
inline size_t SignBytes(size_t n) { return 8 * ((n + 63) / 64); }

// Writes SignBytes(x.size()) bytes to `out` (any alignment) and returns
// sum |x[i]|. The sum's order is fixed (8 fp32 lanes per 64 values, each
// block folded into a double, blocks added in index order through per-chunk
// partial sums), so it does not depend on the number of threads. Where an
// fp32 lane overflows on finite values (two near FLT_MAX), the sum is taken
// again in double, in index order.
double PackSigns(absl::Span<const float> x, char* out);

// acc[i] += (bit i of `in`) ? neg : pos, for every i < acc.size().
void AddSigns(const char* in, float pos, float neg, absl::Span<float> acc);

// The same with values that repeat with a period p >= 1 (onebit's columns):
// acc[i] += (bit i) ? neg[i mod p] : pos[i mod p]. `pos` and `neg` hold
// p + 64 values, entry j equal to entry j mod p, so that any 64 consecutive
// lanes are contiguous.
void AddSignsPeriodic(const char* in, absl::Span<const float> pos,
                      absl::Span<const float> neg, absl::Span<float> acc);

// Whether the padding bits after the first n of `in` (SignBytes(n) bytes)
// are zero, as PackSigns writes them; decoders reject payloads where not.
bool SignPaddingIsZero(const char* in, size_t n);

}  // namespace gradcomp::codecs

#endif  // GRADCOMP_CODECS_CPU_BITPACK_H_
