// Top-k selection by a sampled threshold on the GPU: codecs/cpu/select.h
// SelectTopK for a tensor in device memory, with the same result (indices,
// threshold, passes, sample size) for the same x, k, sample fraction and
// stream, so a GPU top-k payload is the CPU's byte for byte (docs/gpu.md).
//
//   GC_ASSIGN_OR_RETURN(TopKSelection sel,
//                       SelectTopKDevice(d_v, n, k, 0.01, rng));
//
// Everything runs on the GPU, on the default stream: the sample, a radix
// selection of its threshold key, the filter pass (its threshold stays on the
// device) and the trim of the candidates to the k that come first, queued
// before the pass's count is known; the host waits once per pass, for the count
// and the indices. Device and pinned host memory are kept per thread across
// calls and grow to the largest selection seen (about 4 * sample_size + 36 * k
// bytes, more when a pass finds more than 2k + 4096), so a steady state
// allocates nothing.
#ifndef GRADCOMP_CODECS_CUDA_SELECT_H_
#define GRADCOMP_CODECS_CUDA_SELECT_H_

#include <cstddef>

#include "absl/status/statusor.h"
#include "codecs/cpu/select.h"
#include "codecs/random.h"

namespace gradcomp::codecs::cuda {

// `x` holds n fp32 values in device memory (n < 2^32). Unavailable without
// a GPU; InvalidArgument for n >= 2^32.
absl::StatusOr<TopKSelection> SelectTopKDevice(const float* x, size_t n,
                                               size_t k, double sample_fraction,
                                               const PhiloxStream& rng);

}  // namespace gradcomp::codecs::cuda

#endif  // GRADCOMP_CODECS_CUDA_SELECT_H_
