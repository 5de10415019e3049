#include <cstdint>

#include "codecs/cuda/nonfinite.h"

namespace gradcomp::codecs::cuda {
namespace {

constexpr int kThreads = 256;
constexpr size_t kMaxBlocks = 1024;

// Each thread counts a grid-strided share, each warp sums its threads' counts
// with shuffles, and lane 0 adds a nonzero sum to *count: one atomic per
// warp at most, none for a finite tensor.
__global__ void CountNonfiniteKernel(const float* __restrict__ x, size_t n,
                                     unsigned long long* count) {
  unsigned long long mine = 0;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < n; i += stride) {
    mine += (__float_as_uint(x[i]) & 0x7f800000u) == 0x7f800000u ? 1 : 0;
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    mine += __shfl_down_sync(0xffffffffu, mine, offset);
  }
  if ((threadIdx.x & 31) == 0 && mine != 0) atomicAdd(count, mine);
}

}  // namespace

cudaError_t LaunchCountNonfinite(const float* x, size_t n,
                                 unsigned long long* count,
                                 cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  size_t blocks = (n + kThreads - 1) / kThreads;
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  CountNonfiniteKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      x, n, count);
  return cudaGetLastError();
}

}  // namespace gradcomp::codecs::cuda
