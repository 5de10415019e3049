// The qsgd codec's body: per bucket the fp32 L2 norm, then bit-packed codes
// (level | sign << (bits - 1)), as codecs/cpu/qsgd.cc computes them.
#include <cstddef>
#include <cstdint>

#include "codecs/cuda/kernels.h"
#include "codecs/cuda/philox.cuh"

namespace gradcomp::codecs::cuda {
namespace {

constexpr int kThreads = 256;
// codecs/cpu/kernels.cc BucketSumOfSquares sums in 8 fp32 lanes; here each
// lane is a thread, so 8 threads share a bucket and 32 buckets share a block.
constexpr int kLanes = 8;

__global__ void QsgdNormKernel(const float* __restrict__ x, size_t n,
                               size_t bucket, float levels,
                               float* __restrict__ norms, int* nonfinite) {
  const size_t buckets = (n + bucket - 1) / bucket;
  const int lane = threadIdx.x % kLanes;
  const size_t first =
      (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kLanes;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x / kLanes;
  // Every lane of a group runs the same number of iterations, so the
  // shuffles below always see all eight.
  for (size_t b = first; b < (buckets + stride - 1) / stride * stride;
       b += stride) {
    const bool live = b < buckets;
    const size_t b0 = b * bucket;
    const size_t len = live ? (b0 + bucket < n ? bucket : n - b0) : 0;
    const size_t laned = len - len % kLanes;
    float sum = 0;
    for (size_t i = lane; i < laned; i += kLanes) {
      const float v = x[b0 + i];
      sum = __fadd_rn(sum, __fmul_rn(v, v));
    }
    // Lanes fold in order 0..7, then the tail, as on the CPU.
    float total = 0;
    for (int j = 0; j < kLanes; ++j) {
      total = __fadd_rn(total, __shfl_sync(0xFFFFFFFFu, sum, j, kLanes));
    }
    if (!live || lane != 0) continue;
    for (size_t i = laned; i < len; ++i) {
      const float v = x[b0 + i];
      total = __fadd_rn(total, __fmul_rn(v, v));
    }
    float norm = __fsqrt_rn(total);
    const float scale = __fdiv_rn(levels, norm);
    if (!isfinite(norm)) atomicOr(nonfinite, 1);
    if (!isfinite(scale) || !isfinite(norm)) norm = 0;
    norms[b] = norm;
  }
}

// One thread per group of 8 codes: they share a Philox block and fill
// exactly `bits` bytes.
__global__ void QsgdCodeKernel(const float* __restrict__ x, size_t n,
                               size_t bucket, int bits, PhiloxWords rng,
                               const float* __restrict__ norms,
                               uint8_t* __restrict__ codes) {
  const int levels = (1 << (bits - 1)) - 1;
  const uint32_t sign = 1u << (bits - 1);
  const size_t groups = (n + 7) / 8;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t g = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       g < groups; g += stride) {
    uint32_t words[8];
    PhiloxBlock(rng, g, words);
    const size_t count = 8 * g + 8 <= n ? 8 : n - 8 * g;
    uint64_t packed = 0;
    for (size_t j = 0; j < count; ++j) {
      const size_t i = 8 * g + j;
      const float norm = norms[i / bucket];
      if (norm == 0) continue;  // the CPU writes 0 for a zeroed bucket
      const float scale = __fdiv_rn(static_cast<float>(levels), norm);
      const float xi = x[i];
      const float raised =
          __fadd_rn(__fmul_rn(fabsf(xi), scale), ToUniform(words[j]));
      const int raised_level = static_cast<int>(raised);
      const uint32_t level =
          static_cast<uint32_t>(raised_level < levels ? raised_level : levels);
      const uint32_t code = level | (signbit(xi) ? sign : 0u);
      packed |= static_cast<uint64_t>(code) << (bits * j);
    }
    uint8_t* out = codes + g * bits;
    const size_t bytes = (count * bits + 7) / 8;
    for (size_t k = 0; k < bytes; ++k) {
      out[k] = static_cast<uint8_t>(packed >> (8 * k));
    }
  }
}

unsigned BlocksFor(size_t threads) {
  const size_t blocks = (threads + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65536 ? (blocks > 0 ? blocks : 1)
                                              : 65536);
}

}  // namespace

cudaError_t LaunchQsgdEncode(const float* x, size_t n, size_t bucket, int bits,
                             const PhiloxWords& rng, void* norms,
                             uint8_t* codes, int* nonfinite,
                             cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const size_t buckets = (n + bucket - 1) / bucket;
  const float levels = static_cast<float>((1 << (bits - 1)) - 1);
  float* norm_values = static_cast<float*>(norms);
  QsgdNormKernel<<<BlocksFor(buckets * kLanes), kThreads, 0, stream>>>(
      x, n, bucket, levels, norm_values, nonfinite);
  const cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) return error;
  QsgdCodeKernel<<<BlocksFor((n + 7) / 8), kThreads, 0, stream>>>(
      x, n, bucket, bits, rng, norm_values, codes);
  return cudaGetLastError();
}

}  // namespace gradcomp::codecs::cuda
