// The GPU steps of top-k selection by a sampled threshold
// (codecs/cpu/select.cc): the stratified sample, magnitude keys, the sort of
// the sample and the filter, the last two with CUB.
#include <thrust/iterator/counting_iterator.h>

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

__global__ void GatherKeysKernel(const float* __restrict__ x,
                                 const uint32_t* __restrict__ indices,
                                 size_t count, uint32_t* __restrict__ keys) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t j = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       j < count; j += stride) {
    keys[j] = Key(x[indices != nullptr ? indices[j] : j]);
  }
}

struct KeyAtLeast {
  uint32_t threshold;
  __device__ bool operator()(float v) const { return Key(v) >= threshold; }
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

cudaError_t LaunchGatherKeys(const float* x, const uint32_t* indices,
                             size_t count, uint32_t* keys,
                             cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  GatherKeysKernel<<<BlocksFor(count), kThreads, 0, stream>>>(x, indices, count,
                                                              keys);
  return cudaGetLastError();
}

cudaError_t SortKeysDescending(void* temp, size_t& temp_bytes,
                               const uint32_t* keys, uint32_t* sorted,
                               size_t count, cudaStream_t stream) {
  return cub::DeviceRadixSort::SortKeysDescending(temp, temp_bytes, keys,
                                                  sorted, count, 0, 32, stream);
}

cudaError_t SelectAtLeast(void* temp, size_t& temp_bytes, const float* x,
                          size_t n, uint32_t threshold, uint32_t* indices,
                          int64_t* selected, cudaStream_t stream) {
  return cub::DeviceSelect::FlaggedIf(
      temp, temp_bytes, thrust::counting_iterator<uint32_t>(0), x, indices,
      selected, static_cast<int64_t>(n), KeyAtLeast{threshold}, stream);
}

}  // namespace gradcomp::codecs::cuda
