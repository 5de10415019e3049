// Host entry points of the top-k selection kernels (select_kernels.cu), the
// GPU steps of codecs/cpu/select.cc SelectTopK; codecs/cuda/select.h puts
// them together. Magnitudes are compared as keys: the bits of |x| (NaN above
// +Inf), as on the CPU. Every pointer is device memory; each call runs on
// `stream` and returns the launch's (or CUB's) error.
//
// The two CUB calls take scratch space as CUB does: called with a null
// `temp`, they only set `temp_bytes`.
#ifndef GRADCOMP_CODECS_CUDA_SELECT_KERNELS_H_
#define GRADCOMP_CODECS_CUDA_SELECT_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "codecs/cuda/kernels.h"

namespace gradcomp::codecs::cuda {

// keys[j] = key of x at the position StratifiedSample (codecs/cpu/select.cc)
// draws for stratum j of `count` (one Philox 64-bit word per stratum).
cudaError_t LaunchStratifiedSample(const float* x, size_t n, size_t count,
                                   const PhiloxWords& rng, uint32_t* keys,
                                   cudaStream_t stream);

// keys[j] = key of x[indices[j]]; with null `indices`, of x[j].
cudaError_t LaunchGatherKeys(const float* x, const uint32_t* indices,
                             size_t count, uint32_t* keys, cudaStream_t stream);

// sorted = keys in descending order (CUB radix sort).
cudaError_t SortKeysDescending(void* temp, size_t& temp_bytes,
                               const uint32_t* keys, uint32_t* sorted,
                               size_t count, cudaStream_t stream);

// indices = every i < n with key(x[i]) >= threshold, ascending (CUB
// DeviceSelect keeps the input order); *selected = their number.
cudaError_t SelectAtLeast(void* temp, size_t& temp_bytes, const float* x,
                          size_t n, uint32_t threshold, uint32_t* indices,
                          int64_t* selected, cudaStream_t stream);

}  // namespace gradcomp::codecs::cuda

#endif  // GRADCOMP_CODECS_CUDA_SELECT_KERNELS_H_
