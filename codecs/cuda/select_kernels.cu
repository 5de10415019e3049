// The GPU steps of top-k selection by a sampled threshold
// (codecs/cpu/select.cc): the stratified sample, magnitude keys, a radix
// selection of the rank-th largest key, the filter and the trim, the two
// compactions in index order with CUB.
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

constexpr int kRadixPasses = 3;
constexpr int kDigitShift[kRadixPasses] = {21, 10, 0};
constexpr int kDigitBits[kRadixPasses] = {11, 11, 10};
constexpr int kPickThreads = 1024;  // two of the 2048 bins each

__global__ void RadixInitKernel(uint32_t rank, RadixState* state) {
  for (int i = threadIdx.x; i < 2048; i += blockDim.x) {
    state->histogram[i] = 0;
  }
  if (threadIdx.x == 0) {
    state->key = 0;
    state->rank = rank;
    state->greater = 0;
    state->ties = 0;
  }
}

// Counts the digit at `shift` of every key whose bits above the digit
// (`decided`) equal those chosen so far (state->key).
__global__ void RadixHistogramKernel(const uint32_t* __restrict__ keys,
                                     size_t count, int shift,
                                     uint32_t digit_mask, uint32_t decided,
                                     RadixState* state) {
  __shared__ uint32_t histogram[2048];
  for (int i = threadIdx.x; i < 2048; i += blockDim.x) histogram[i] = 0;
  __syncthreads();
  const uint32_t prefix = state->key;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t j = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       j < count; j += stride) {
    const uint32_t key = keys[j];
    if ((key & decided) == prefix) {
      atomicAdd(&histogram[(key >> shift) & digit_mask], 1u);
    }
  }
  __syncthreads();
  for (uint32_t i = threadIdx.x; i <= digit_mask; i += blockDim.x) {
    if (histogram[i] != 0) atomicAdd(&state->histogram[i], histogram[i]);
  }
}

// The digit at `shift` of the rank-th largest: the bins from the top,
// summed, first reach the rank at it. Clears the histogram for the next
// pass.
__global__ void RadixPickKernel(int shift, RadixState* state) {
  using Scan = cub::BlockScan<uint32_t, kPickThreads>;
  __shared__ typename Scan::TempStorage scan;
  const uint32_t high = 2047 - 2 * threadIdx.x;  // this thread's upper bin
  const uint32_t count_high = state->histogram[high];
  const uint32_t count_low = state->histogram[high - 1];
  const uint32_t rank = state->rank;
  uint32_t above = 0;
  Scan(scan).ExclusiveSum(count_high + count_low, above);
  __syncthreads();
  state->histogram[high] = 0;
  state->histogram[high - 1] = 0;
  uint32_t digit = 0, larger = 0, ties = 0;
  bool found = false;
  if (above < rank && above + count_high >= rank) {
    digit = high, larger = above, ties = count_high, found = true;
  } else if (above + count_high < rank &&
             above + count_high + count_low >= rank) {
    digit = high - 1, larger = above + count_high, ties = count_low;
    found = true;
  }
  if (found) {
    state->key |= digit << shift;
    state->rank = rank - larger;
    state->greater += larger;
    state->ties = ties;
  }
}

// state->last = the order value (CandidateKeysKernel) of the k-th candidate
// in the order of selection. The candidates above the selected key
// (state->greater) all come first; of those equal to it, the first m =
// k - greater in index order follow. When all of them are kept (the usual
// case: one candidate has that key) the key alone decides; otherwise one
// block walks the candidates in index order to the m-th.
__global__ void LastOrderKernel(const uint32_t* __restrict__ keys,
                                const uint32_t* __restrict__ candidates,
                                size_t capacity, uint32_t k,
                                RadixState* state) {
  using Scan = cub::BlockScan<uint32_t, kPickThreads>;
  __shared__ typename Scan::TempStorage scan;
  const uint32_t key = state->key;
  const uint32_t m = k - state->greater;
  if (m >= state->ties || key == 0) {
    if (threadIdx.x == 0) state->last = static_cast<uint64_t>(key) << 32;
    return;
  }
  uint32_t seen = 0;  // candidates equal to `key` before this chunk
  for (size_t start = 0; start < capacity; start += blockDim.x) {
    const size_t j = start + threadIdx.x;
    const bool tie = j < capacity && keys[j] == key;
    uint32_t before = 0, total = 0;
    Scan(scan).ExclusiveSum(tie ? 1u : 0u, before, total);
    if (tie && seen + before + 1 == m) {
      state->last = static_cast<uint64_t>(key) << 32 |
                    static_cast<uint32_t>(~candidates[j]);
    }
    seen += total;
    if (seen >= m) break;
    __syncthreads();
  }
}

// keys[j] = key of candidate j; order[j] ranks it in the order of selection
// (larger key, then the lower index) as one number: the key above the
// complemented index. Entries past the found ones get key and order 0, which
// come after every candidate (a candidate's key is at least kSmallestKey).
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

// Whether a candidate comes no later than the k-th (LastOrderKernel). With
// fewer than k found, the k-th is padding (key 0): then every candidate
// (key >= 1) is kept and the padding (order 0) is not.
struct NotAfter {
  const RadixState* state;
  __device__ bool operator()(uint64_t order) const {
    return order >= max(__ldg(&state->last), uint64_t{1} << 32);
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

cudaError_t LaunchRadixSelect(const uint32_t* keys, size_t count, size_t rank,
                              RadixState* state, cudaStream_t stream) {
  RadixInitKernel<<<1, kPickThreads, 0, stream>>>(static_cast<uint32_t>(rank),
                                                  state);
  const unsigned blocks = std::min(BlocksFor((count + 7) / 8), 528u);
  for (int pass = 0; pass < kRadixPasses; ++pass) {
    const int shift = kDigitShift[pass];
    const int top = shift + kDigitBits[pass];
    const uint32_t decided = top >= 32 ? 0u : ~((1u << top) - 1);
    RadixHistogramKernel<<<blocks, kThreads, 0, stream>>>(
        keys, count, shift, (1u << kDigitBits[pass]) - 1, decided, state);
    RadixPickKernel<<<1, kPickThreads, 0, stream>>>(shift, state);
  }
  return cudaGetLastError();
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
                       uint32_t* keys, uint64_t* order, RadixState* state,
                       uint32_t* kept, SelectStatus* status,
                       cudaStream_t stream) {
  const auto items = static_cast<int64_t>(capacity);
  if (temp == nullptr) {
    return cub::DeviceSelect::FlaggedIf(nullptr, temp_bytes, candidates, order,
                                        kept, &status->kept, items,
                                        NotAfter{state}, stream);
  }
  CandidateKeysKernel<<<BlocksFor(capacity), kThreads, 0, stream>>>(
      x, candidates, capacity, status, keys, order);
  cudaError_t error = LaunchRadixSelect(keys, capacity, k, state, stream);
  if (error != cudaSuccess) return error;
  LastOrderKernel<<<1, kPickThreads, 0, stream>>>(
      keys, candidates, capacity, static_cast<uint32_t>(k), state);
  error = cudaGetLastError();
  if (error != cudaSuccess) return error;
  size_t bytes = temp_bytes;
  return cub::DeviceSelect::FlaggedIf(temp, bytes, candidates, order, kept,
                                      &status->kept, items, NotAfter{state},
                                      stream);
}

}  // namespace gradcomp::codecs::cuda
