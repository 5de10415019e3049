// The sign codecs' kernels (codecs/cpu/bitpack.cc, codecs/cpu/sign.cc).
#include <cstddef>
#include <cstdint>

#include "codecs/cuda/sign_kernels.h"

namespace gradcomp::codecs::cuda {
namespace {

constexpr int kThreads = 256;
constexpr unsigned kFull = 0xFFFFFFFFu;

// A 64-value block is an 8 x 8 matrix, row j = x[8j, 8j + 8); bitpack.cc
// PackBlock sums column l (its lane l) down the rows in fp32. One thread per
// (block, column): at each row the 8 threads of a block read one 32-byte
// sector, so every byte read is used. Values past n are the CPU's zero
// padding.
__global__ void SignPackKernel(const float* __restrict__ x, size_t n,
                               uint32_t* __restrict__ signs,
                               double* __restrict__ block_sums, size_t blocks) {
  const size_t t = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t block = t / 8;
  const unsigned lane = threadIdx.x % 8;
  const bool live = block < blocks;
  float lane_sum = 0;
  uint64_t bits = 0;
  if (live) {
    const size_t base = 64 * block + lane;
#pragma unroll
    for (int row = 0; row < 8; ++row) {
      const size_t i = base + 8 * row;
      const float v = i < n ? x[i] : 0.0f;
      lane_sum = __fadd_rn(lane_sum, fabsf(v));
      if (v < 0.0f) bits |= uint64_t{1} << (8 * row + lane);
    }
  }
  double sum = lane_sum;
  for (int offset = 1; offset < 8; offset *= 2) {
    bits |= __shfl_xor_sync(kFull, bits, offset, 8);
    sum = __dadd_rn(sum, __shfl_xor_sync(kFull, sum, offset, 8));
  }
  if (!live) return;
  // Two 32-bit stores: the signs follow 4-byte scales, so a word may sit
  // at an address that is not a multiple of 8.
  if (lane == 0) {
    signs[2 * block] = static_cast<uint32_t>(bits);
    block_sums[block] = sum;
  } else if (lane == 1) {
    signs[2 * block + 1] = static_cast<uint32_t>(bits >> 32);
  }
}

__global__ void SignDecodeKernel(const float* __restrict__ scales,
                                 const uint32_t* __restrict__ signs, size_t n,
                                 size_t span, float alpha,
                                 float* __restrict__ acc) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < n; i += stride) {
    const float value = __fmul_rn(alpha, scales[i / span]);
    const bool negative = (signs[i / 32] >> (i % 32)) & 1u;
    acc[i] = __fadd_rn(acc[i], negative ? -value : value);
  }
}

__global__ void MomentumKernel(const float* __restrict__ g, size_t n,
                               float beta, float rest, float* __restrict__ m) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < n; i += stride) {
    m[i] = __fadd_rn(__fmul_rn(beta, m[i]), __fmul_rn(rest, g[i]));
  }
}

unsigned GridFor(size_t threads) {
  const size_t blocks = (threads + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65536 ? (blocks > 0 ? blocks : 1)
                                              : 65536);
}

}  // namespace

cudaError_t LaunchSignPack(const float* x, size_t n, void* signs,
                           double* block_sums, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const size_t blocks = (n + 63) / 64;
  const size_t grid = (8 * blocks + kThreads - 1) / kThreads;
  SignPackKernel<<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(
      x, n, static_cast<uint32_t*>(signs), block_sums, blocks);
  return cudaGetLastError();
}

cudaError_t LaunchSignDecodeAdd(const float* scales, const void* signs,
                                size_t n, size_t span, float alpha, float* acc,
                                cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  SignDecodeKernel<<<GridFor(n), kThreads, 0, stream>>>(
      scales, static_cast<const uint32_t*>(signs), n, span, alpha, acc);
  return cudaGetLastError();
}

cudaError_t LaunchMomentumUpdate(const float* g, size_t n, float beta,
                                 float rest, float* m, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  MomentumKernel<<<GridFor(n), kThreads, 0, stream>>>(g, n, beta, rest, m);
  return cudaGetLastError();
}

}  // namespace gradcomp::codecs::cuda
