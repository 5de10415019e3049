// The GPU steps of top-k selection by a sampled threshold
// (codecs/cpu/select.cc): the stratified sample, magnitude keys, the sort of
// the sample, the filter and the trim, the sorts and compactions with CUB.
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/tabulate_output_iterator.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cub/cub.cuh>

#include "codecs/cuda/philox.cuh"
#include "codecs/cuda/select_kernels.h"

namespace gradcomp::codecs::cuda {
namespace {

constexpr int kThreads = 256;

__device__ uint32_t Key(float x) { return __float_as_uint(x) & 0x7FFFFFFFu; }

// Stratum j is [j * n / count, (j + 1) * n / count); its position is the
// first plus word j % 4 of Philox block j / 4, modulo the width. (n < 2^32,
// so j * n fits in 64 bits.)
__global__ void SampleKernel(const float* __restrict__ x, uint64_t n,
                             uint64_t count, PhiloxWords rng,
                             uint32_t* __restrict__ keys) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t j =
           static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       j < count; j += stride) {
    uint64_t words[4];
    PhiloxBlock64(rng, j / 4, words);
    const uint64_t first = j * n / count;
    const uint64_t width = (j + 1) * n / count - first;
    keys[j] = Key(x[first + words[j % 4] % width]);
  }
}

__global__ void KeysKernel(const float* __restrict__ x, size_t count,
                           uint32_t* __restrict__ keys) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t j = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       j < count; j += stride) {
    keys[j] = Key(x[j]);
  }
}

__global__ void SetThresholdKernel(const uint32_t* key, uint32_t floor,
                                   SelectStatus* status) {
  status->threshold = key != nullptr ? max(*key, floor) : floor;
}

// keys[j] = key of candidate j; order[j] ranks it in the order of selection
// (larger key, then the lower index) as one number: the key above the
// complemented index. Entries past the found ones get key and order 0, which
// sort after every candidate (a candidate's key is at least kSmallestKey).
__global__ void CandidateKeysKernel(const float* __restrict__ x,
                                    const uint32_t* __restrict__ candidates,
                                    size_t capacity,
                                    const SelectStatus* __restrict__ status,
                                    uint32_t* __restrict__ keys,
                                    uint64_t* __restrict__ order) {
  const size_t found = static_cast<size_t>(status->found);
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t j = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       j < capacity; j += stride) {
    if (j < found) {
      const uint32_t i = candidates[j];
      const uint32_t key = Key(x[i]);
      keys[j] = key;
      order[j] = static_cast<uint64_t>(key) << 32 | static_cast<uint32_t>(~i);
    } else {
      keys[j] = 0;
      order[j] = 0;
    }
  }
}

struct KeyAtLeast {
  const SelectStatus* status;
  __device__ bool operator()(float v) const {
    return Key(v) >= status->threshold;
  }
};

// Writes selected entry `position` only below the capacity.
struct StoreBelow {
  uint32_t* out;
  int64_t capacity;
  __device__ void operator()(int64_t position, uint32_t index) const {
    if (position < capacity) out[position] = index;
  }
};

// Whether a candidate comes no later than the k-th (key, index) of the
// descending, stable sort of the candidates' keys. With fewer than k found,
// that k-th entry is padding (key 0): then every candidate (key >= 1) is
// kept and the padding (order 0) is not.
struct NotAfter {
  const uint32_t* last_key;
  const uint32_t* last_index;
  __device__ bool operator()(uint64_t order) const {
    const uint64_t last = static_cast<uint64_t>(__ldg(last_key)) << 32 |
                          static_cast<uint32_t>(~__ldg(last_index));
    return order >= max(last, uint64_t{1} << 32);
  }
};

unsigned BlocksFor(size_t n) {
  const size_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65536 ? (blocks > 0 ? blocks : 1)
                                              : 65536);
}

}  // namespace

cudaError_t LaunchStratifiedSample(const float* x, size_t n, size_t count,
                                   const PhiloxWords& rng, uint32_t* keys,
                                   cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  SampleKernel<<<BlocksFor(count), kThreads, 0, stream>>>(x, n, count, rng,
                                                          keys);
  return cudaGetLastError();
}

cudaError_t LaunchKeys(const float* x, size_t count, uint32_t* keys,
                       cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  KeysKernel<<<BlocksFor(count), kThreads, 0, stream>>>(x, count, keys);
  return cudaGetLastError();
}

cudaError_t SortKeysDescending(void* temp, size_t& temp_bytes,
                               const uint32_t* keys, uint32_t* sorted,
                               size_t count, cudaStream_t stream) {
  return cub::DeviceRadixSort::SortKeysDescending(temp, temp_bytes, keys,
                                                  sorted, count, 0, 32, stream);
}

cudaError_t LaunchSetThreshold(const uint32_t* key, uint32_t floor,
                               SelectStatus* status, cudaStream_t stream) {
  SetThresholdKernel<<<1, 1, 0, stream>>>(key, floor, status);
  return cudaGetLastError();
}

cudaError_t SelectAtLeast(void* temp, size_t& temp_bytes, const float* x,
                          size_t n, SelectStatus* status, uint32_t* indices,
                          size_t capacity, cudaStream_t stream) {
  auto out = thrust::make_tabulate_output_iterator(
      StoreBelow{indices, static_cast<int64_t>(capacity)});
  return cub::DeviceSelect::FlaggedIf(
      temp, temp_bytes, thrust::counting_iterator<uint32_t>(0), x, out,
      &status->found, static_cast<int64_t>(n), KeyAtLeast{status}, stream);
}

cudaError_t TrimToTopK(void* temp, size_t& temp_bytes, const float* x,
                       const uint32_t* candidates, size_t capacity, size_t k,
                       uint32_t* keys, uint32_t* sorted_keys, uint64_t* order,
                       uint32_t* sorted_indices, uint32_t* kept,
                       SelectStatus* status, cudaStream_t stream) {
  // A stable sort by key alone: equal keys stay in ascending index order, so
  // the k-th entry is the last of the selection order.
  const NotAfter not_after{sorted_keys + k - 1, sorted_indices + k - 1};
  const auto items = static_cast<int64_t>(capacity);
  if (temp == nullptr) {
    size_t sort_bytes = 0, select_bytes = 0;
    cudaError_t error = cub::DeviceRadixSort::SortPairsDescending(
        nullptr, sort_bytes, keys, sorted_keys, candidates, sorted_indices,
        items, 0, 32, stream);
    if (error != cudaSuccess) return error;
    error = cub::DeviceSelect::FlaggedIf(nullptr, select_bytes, candidates,
                                         order, kept, &status->kept, items,
                                         not_after, stream);
    temp_bytes = std::max(sort_bytes, select_bytes);
    return error;
  }
  CandidateKeysKernel<<<BlocksFor(capacity), kThreads, 0, stream>>>(
      x, candidates, capacity, status, keys, order);
  cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) return error;
  size_t bytes = temp_bytes;
  error = cub::DeviceRadixSort::SortPairsDescending(
      temp, bytes, keys, sorted_keys, candidates, sorted_indices, items, 0, 32,
      stream);
  if (error != cudaSuccess) return error;
  bytes = temp_bytes;
  return cub::DeviceSelect::FlaggedIf(temp, bytes, candidates, order, kept,
                                      &status->kept, items, not_after, stream);
}

}  // namespace gradcomp::codecs::cuda
