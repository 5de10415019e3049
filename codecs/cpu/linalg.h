// Small dense linear-algebra helpers for the low-rank codecs (PowerSGD,
// ATOMO): column orthonormalisation of a tall factor and Gaussian draws from
// a Philox stream, both deterministic so that every rank computes the same.
//
//   OrthonormalizeColumns(absl::MakeSpan(p), rows, rank);  // p is rows x rank
//   FillGaussian(PhiloxStream(seed, tensor, step, 0), 0, absl::MakeSpan(q));
#ifndef GRADCOMP_CODECS_CPU_LINALG_H_
#define GRADCOMP_CODECS_CPU_LINALG_H_

#include <cstddef>
#include <cstdint>

#include "absl/types/span.h"
#include "codecs/random.h"

namespace gradcomp::codecs {

// Orthonormalises the columns of the row-major rows x cols matrix `a` in
// place, left to right (modified Gram-Schmidt, the order PyTorch's
// powerSGD_hook uses), in double, with a second projection pass per column:
// one pass loses orthogonality when a column is nearly dependent on the
// earlier ones, and a fp32 factor is nearly dependent whenever the matrix
// it came from has rank < cols. A column whose residual is exactly zero
// stays zero (no epsilon is added to norms, so that tiny gradients are not
// scaled down). Returns the number of such zero columns.
int OrthonormalizeColumns(absl::Span<float> a, size_t rows, size_t cols);

// out[j] = standard normal number first + j of `rng`, by Box-Muller
// over uniform pairs: numbers 2i and 2i + 1 take uniforms 2i and 2i + 1 (the
// cosine and the sine branch), so any element is a pure function of its
// index and the key.
void FillGaussian(const PhiloxStream& rng, uint64_t first,
                  absl::Span<float> out);

}  // namespace gradcomp::codecs

#endif  // GRADCOMP_CODECS_CPU_LINALG_H_
