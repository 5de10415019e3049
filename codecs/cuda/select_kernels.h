// Host entry points of the top-k selection kernels (select_kernels.cu), the
// GPU steps of codecs/cpu/select.cc SelectTopK; codecs/cuda/select.h puts
// them together. Magnitudes are compared as keys: the bits of |x| (NaN above
// +Inf), as on the CPU. Every pointer is device memory; each call runs on
// `stream` and returns the launch's (or CUB's) error.
//
// The threshold of a filter pass stays on the device (SelectStatus), so the
// sample, its sort and the filter run without a round trip to the host.
// The CUB calls take scratch space as CUB does: called with a null `temp`,
// they only set `temp_bytes`.
#ifndef GRADCOMP_CODECS_CUDA_SELECT_KERNELS_H_
#define GRADCOMP_CODECS_CUDA_SELECT_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "codecs/cuda/kernels.h"

namespace gradcomp::codecs::cuda {

// A filter pass's threshold key and what it found, in device memory; the
// host reads it back in one copy after the pass.
struct SelectStatus {
  int64_t found = 0;  // entries at or above `threshold`
  int64_t kept = 0;   // entries the trim kept
  uint32_t threshold = 0;
  uint32_t unused = 0;
};

// keys[j] = key of x at the position StratifiedSample (codecs/cpu/select.cc)
// draws for stratum j of `count` (one Philox 64-bit word per stratum).
cudaError_t LaunchStratifiedSample(const float* x, size_t n, size_t count,
                                   const PhiloxWords& rng, uint32_t* keys,
                                   cudaStream_t stream);

// keys[j] = key of x[j], j < count.
cudaError_t LaunchKeys(const float* x, size_t count, uint32_t* keys,
                       cudaStream_t stream);

// sorted = keys in descending order (CUB radix sort).
cudaError_t SortKeysDescending(void* temp, size_t& temp_bytes,
                               const uint32_t* keys, uint32_t* sorted,
                               size_t count, cudaStream_t stream);

// status->threshold = max(*key, floor); with null `key`, floor.
cudaError_t LaunchSetThreshold(const uint32_t* key, uint32_t floor,
                               SelectStatus* status, cudaStream_t stream);

// Every i < n with key(x[i]) >= status->threshold, ascending (CUB
// DeviceSelect keeps the input order): status->found = their number, and the
// first `capacity` of them go to `indices` (the rest are counted only).
cudaError_t SelectAtLeast(void* temp, size_t& temp_bytes, const float* x,
                          size_t n, SelectStatus* status, uint32_t* indices,
                          size_t capacity, cudaStream_t stream);

// The trim of the candidates a pass found (the first status->found of
// `capacity` ascending indices of x; the rest of the buffer is ignored) to
// the k that come first: larger key, then the lower index
// (codecs/cpu/select_rules.h TrimToTopK). `kept` receives min(found, k)
// indices, ascending, and status->kept their number. Queued without knowing
// `found` on the host, so a pass and its trim need one wait; the result is
// meaningless when found > capacity (the caller grows the buffer and
// filters again). `keys`, `sorted_keys`, `order` and `sorted_indices` hold
// `capacity` entries each, `kept` k. Every CUB step uses `temp`.
cudaError_t TrimToTopK(void* temp, size_t& temp_bytes, const float* x,
                       const uint32_t* candidates, size_t capacity, size_t k,
                       uint32_t* keys, uint32_t* sorted_keys, uint64_t* order,
                       uint32_t* sorted_indices, uint32_t* kept,
                       SelectStatus* status, cudaStream_t stream);

}  // namespace gradcomp::codecs::cuda

#endif  // GRADCOMP_CODECS_CUDA_SELECT_KERNELS_H_
