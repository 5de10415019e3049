// Top-k selection by a sampled threshold (Deep Gradient Compression, Lin et
// al. 2018, step 3): about k entries of largest magnitude in one pass over
// memory, without sorting the tensor.
//
//   PhiloxStream rng(ctx.seed, ctx.tensor_id, ctx.step, /*round=*/0);
//   TopKSelection sel = SelectTopK(v, k, /*sample_fraction=*/0.01, rng);
//   for (uint32_t i : sel.indices) ... v[i] ...
#ifndef GRADCOMP_CODECS_CPU_SELECT_H_
#define GRADCOMP_CODECS_CPU_SELECT_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "codecs/random.h"

namespace gradcomp::codecs {

struct TopKSelection {
  // Strictly ascending; at most k; only entries with a nonzero magnitude
  // (sending a zero changes nothing and costs 8 bytes).
  std::vector<uint32_t> indices;
  // The magnitude threshold of the last filter pass.
  float threshold = 0;
  // Filter passes over the tensor (1 unless the first threshold was too high).
  int passes = 0;
  // Values sampled to estimate the threshold (x.size() for an exact pass).
  size_t sample_size = 0;
};

// Selects at most k indices of the largest |x[i]| (x.size() < 2^32).
//
// Samples max(ceil(sample_fraction * n), ceil(2n / k)) entries, one uniformly
// from each of that many equal strata (so a row-periodic tensor cannot alias
// with the stride), takes the ceil(k * sample / n)-th largest sampled
// magnitude as the threshold and keeps every |x[i]| >= threshold. Too few
// (< 0.8k): the threshold is lowered by 0.8 and the pass repeated, at most 10
// passes in all. More than k: the exact top k of the kept ones, ties broken by
// the lower index, so that |indices| <= k always (the paper trims only above
// 1.3k; trimming the candidates is cheap and makes k a hard payload bound).
// With a sample of the whole tensor the threshold is the exact k-th largest
// magnitude and the result is the exact top k. NaN counts as larger than
// +Inf, so a non-finite value is always selected rather than kept forever
// (top-k then refuses the step and resets it).
TopKSelection SelectTopK(absl::Span<const float> x, size_t k,
                         double sample_fraction, const PhiloxStream& rng);

// Whether the filter currently takes its AVX2 path (x86-64 with AVX2); it
// finds the same indices as the SSE2 path.
bool SelectSimdActive();

// Tests force the SSE2 path with true, and restore dispatch with false.
void DisableSelectSimdForTesting(bool disable);

}  // namespace gradcomp::codecs

#endif  // GRADCOMP_CODECS_CPU_SELECT_H_
