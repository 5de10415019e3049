// Host entry points of the top-k selection kernels (select_kernels.cu), the
// GPU steps of codecs/cpu/select.cc SelectTopK; codecs/cuda/select.h puts
// them together. Magnitudes are compared as keys: the bits of |x| (NaN above
// +Inf), as on the CPU. Every pointer is device memory; each call runs on
// `stream` and returns the launch's (or CUB's) error.
//
// The threshold of a filter pass stays on the device (SelectStatus), so the
// sample, its radix selection and the filter run without a round trip to
// the host.
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

// A radix selection's state in device memory (LaunchRadixSelect).
struct RadixState {
  uint32_t key;      // the selected key
  uint32_t rank;     // its rank among the keys left (working value)
  uint32_t greater;  // keys larger than it
  uint32_t ties;     // keys equal to it
  uint64_t last;     // TrimToTopK: the order value of the k-th candidate
  uint32_t histogram[2048];
};

// state->key = the rank-th largest (1-based, 1 <= rank <= count) of `count`
// keys, state->greater and state->ties as above: three 11/11/10-bit digit
// passes (a histogram of the keys that match the digits chosen so far, then
// the digit that holds the rank), seven launches, no host wait.
cudaError_t LaunchRadixSelect(const uint32_t* keys, size_t count, size_t rank,
                              RadixState* state, cudaStream_t stream);

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
// filters again). `keys` and `order` hold `capacity` entries each, `kept`
// k; `state` is scratch. The CUB compaction uses `temp`.
cudaError_t TrimToTopK(void* temp, size_t& temp_bytes, const float* x,
                       const uint32_t* candidates, size_t capacity, size_t k,
                       uint32_t* keys, uint64_t* order, RadixState* state,
                       uint32_t* kept, SelectStatus* status,
                       cudaStream_t stream);

}  // namespace gradcomp::codecs::cuda

#endif  // GRADCOMP_CODECS_CUDA_SELECT_KERNELS_H_
