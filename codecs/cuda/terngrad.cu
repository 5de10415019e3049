// TernGrad's kernels (codecs/cpu/terngrad.cc, codecs/cpu/kernels.cc
// SumOfSquares).
#include <cstddef>
#include <cstdint>

#include "codecs/cuda/philox.cuh"
#include "codecs/cuda/terngrad_kernels.h"

namespace gradcomp::codecs::cuda {
namespace {

constexpr int kThreads = 256;
constexpr unsigned kFull = 0xFFFFFFFFu;
constexpr uint32_t kInfBits = 0x7F800000u;
constexpr uint8_t kPlus = 1;
constexpr uint8_t kMinus = 2;

unsigned GridFor(size_t threads) {
  const size_t blocks = (threads + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65536 ? (blocks > 0 ? blocks : 1)
                                              : 65536);
}

// kernels.cc SumOfSquares: a 256-element block is 32 rows of 8 lanes; lane l
// sums x^2 down the rows in fp32. One thread per (block, lane), as
// sign.cu's pack: the 8 threads of a block read one 32-byte sector a row.
__global__ void SumOfSquaresKernel(const float* __restrict__ x, size_t blocks,
                                   double* __restrict__ terms) {
  const size_t t = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t block = t / 8;
  const bool live = block < blocks;
  float lane_sum = 0;
  if (live) {
    const float* row = x + 256 * block + threadIdx.x % 8;
#pragma unroll 8
    for (int r = 0; r < 32; ++r) {
      const float v = row[8 * r];
      lane_sum = __fadd_rn(lane_sum, __fmul_rn(v, v));
    }
  }
  double sum = lane_sum;
  for (int offset = 1; offset < 8; offset *= 2) {
    sum = __dadd_rn(sum, __shfl_xor_sync(kFull, sum, offset, 8));
  }
  if (live && threadIdx.x % 8 == 0) terms[block] = sum;
}

// The tail after the last whole block: double(x) * x, exact in double.
__global__ void TailSquaresKernel(const float* __restrict__ x, size_t begin,
                                  size_t n, double* __restrict__ term) {
  double sum = 0;
  for (size_t i = begin; i < n; ++i) {
    const double v = x[i];
    sum = __dadd_rn(sum, __dmul_rn(v, v));
  }
  *term = sum;
}

// The bucket's largest |x| bits: |x| >= 0 orders as its bits, NaN above
// Inf. A warp whose elements share a bucket reduces first.
__global__ void BucketMaxKernel(const float* __restrict__ x, size_t n,
                                size_t bucket,
                                uint32_t* __restrict__ max_bits) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  const size_t first = static_cast<size_t>(blockIdx.x) * blockDim.x;
  // The loop runs the same number of times in every thread of a warp.
  for (size_t base = first; base < n; base += stride) {
    const size_t i = base + threadIdx.x;
    const bool live = i < n;
    const uint32_t bits = live ? __float_as_uint(fabsf(x[i])) : 0u;
    const size_t warp_first = base + threadIdx.x / 32 * 32;
    const size_t warp_last = warp_first + 31 < n ? warp_first + 31 : n - 1;
    if (warp_first < n && warp_first / bucket == warp_last / bucket) {
      const uint32_t largest = __reduce_max_sync(kFull, bits);
      if (threadIdx.x % 32 == 0)
        atomicMax(max_bits + warp_first / bucket, largest);
    } else if (live) {
      atomicMax(max_bits + i / bucket, bits);
    }
  }
}

struct BucketScale {
  float scale;
  float inverse;
  bool finite;
};

// terngrad.cc EncodeRange's per-bucket scale and its inverse.
__device__ BucketScale ScaleOf(uint32_t max_bits, float clip) {
  const float largest = __uint_as_float(max_bits);
  BucketScale s;
  s.finite = max_bits < kInfBits;
  s.scale = clip < largest ? clip : largest;  // std::min(largest, clip)
  s.inverse = __fdiv_rn(1.0f, s.scale);
  if (!s.finite || !isfinite(s.inverse)) {
    s.scale = 0;
    s.inverse = 0;
  }
  return s;
}

// One thread per group of 8 values: they share a Philox block (uniform i
// is word i % 8 of block i / 8) and fill 2 bytes of codes. The thread also
// writes the scale of every bucket that starts in its group.
__global__ void TernGradCodeKernel(const float* __restrict__ x, size_t n,
                                   size_t bucket, float clip, PhiloxWords rng,
                                   const uint32_t* __restrict__ max_bits,
                                   float* __restrict__ scales,
                                   uint8_t* __restrict__ codes,
                                   int* nonfinite) {
  const size_t groups = (n + 7) / 8;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t g = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       g < groups; g += stride) {
    const size_t begin = 8 * g;
    const size_t count = begin + 8 <= n ? 8 : n - begin;
    for (size_t b = (begin + bucket - 1) / bucket; b * bucket < begin + count;
         ++b) {
      const BucketScale s = ScaleOf(max_bits[b], clip);
      scales[b] = s.scale;
      if (!s.finite) atomicOr(nonfinite, 1);
    }
    uint32_t words[8];
    PhiloxBlock(rng, g, words);
    uint32_t packed = 0;
    size_t bucket_index = begin / bucket;
    BucketScale s = ScaleOf(max_bits[bucket_index], clip);
    for (size_t j = 0; j < count; ++j) {
      const size_t i = begin + j;
      if (i / bucket != bucket_index) {
        bucket_index = i / bucket;
        s = ScaleOf(max_bits[bucket_index], clip);
      }
      const float xi = x[i];
      const float a = fabsf(xi);
      const float p = __fmul_rn(clip < a ? clip : a, s.inverse);
      const uint32_t sign = signbit(xi) ? kMinus : kPlus;
      if (ToUniform(words[j]) < p) packed |= sign << (2 * j);
    }
    uint8_t* out = codes + 2 * g;
    if (count == 8) {
      *reinterpret_cast<uint16_t*>(out) = static_cast<uint16_t>(packed);
    } else {
      out[0] = static_cast<uint8_t>(packed);
      if (count > 4) out[1] = static_cast<uint8_t>(packed >> 8);
    }
  }
}

// Buckets of at most kFusedBucket values, a multiple of 8, with x 16-byte
// aligned: one warp per bucket keeps the bucket in registers, finds its
// largest |x| and writes its codes, reading x once.
constexpr size_t kFusedBucket = 1024;
constexpr int kFusedGroups = kFusedBucket / 8 / 32;  // groups per lane

__global__ void TernGradFusedKernel(const float* __restrict__ x, size_t n,
                                    size_t bucket, float clip, PhiloxWords rng,
                                    float* __restrict__ scales,
                                    uint8_t* __restrict__ codes,
                                    int* nonfinite) {
  const size_t buckets = (n + bucket - 1) / bucket;
  const unsigned lane = threadIdx.x % 32;
  const size_t warps = static_cast<size_t>(gridDim.x) * blockDim.x / 32;
  for (size_t b =
           (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
       b < buckets; b += warps) {
    const size_t b0 = b * bucket;
    const size_t len = b0 + bucket <= n ? bucket : n - b0;
    const size_t groups = (len + 7) / 8;
    float v[kFusedGroups][8];
    uint32_t largest = 0;
#pragma unroll
    for (int j = 0; j < kFusedGroups; ++j) {
      const size_t local = lane + 32 * j;
      const size_t i0 = b0 + 8 * local;
      if (local < groups && i0 + 8 <= n) {
        const float4 lo = *reinterpret_cast<const float4*>(x + i0);
        const float4 hi = *reinterpret_cast<const float4*>(x + i0 + 4);
        v[j][0] = lo.x, v[j][1] = lo.y, v[j][2] = lo.z, v[j][3] = lo.w;
        v[j][4] = hi.x, v[j][5] = hi.y, v[j][6] = hi.z, v[j][7] = hi.w;
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          v[j][e] = local < groups && i0 + e < n ? x[i0 + e] : 0.0f;
        }
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const uint32_t bits = __float_as_uint(fabsf(v[j][e]));
        largest = bits > largest ? bits : largest;
      }
    }
    largest = __reduce_max_sync(kFull, largest);
    const BucketScale s = ScaleOf(largest, clip);
    if (lane == 0) {
      scales[b] = s.scale;
      if (!s.finite) atomicOr(nonfinite, 1);
    }
#pragma unroll
    for (int j = 0; j < kFusedGroups; ++j) {
      const size_t local = lane + 32 * j;
      if (local >= groups) continue;
      const size_t g = b0 / 8 + local;
      const size_t count = 8 * g + 8 <= n ? 8 : n - 8 * g;
      uint32_t words[8];
      PhiloxBlock(rng, g, words);
      uint32_t packed = 0;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float a = fabsf(v[j][e]);
        const float p = __fmul_rn(clip < a ? clip : a, s.inverse);
        const uint32_t sign = signbit(v[j][e]) ? kMinus : kPlus;
        if (e < count && ToUniform(words[e]) < p) packed |= sign << (2 * e);
      }
      uint8_t* out = codes + 2 * g;
      if (count == 8) {
        *reinterpret_cast<uint16_t*>(out) = static_cast<uint16_t>(packed);
      } else {
        out[0] = static_cast<uint8_t>(packed);
        if (count > 4) out[1] = static_cast<uint8_t>(packed >> 8);
      }
    }
  }
}

__global__ void TernGradDecodeKernel(const float* __restrict__ scales,
                                     const uint8_t* __restrict__ codes,
                                     size_t n, size_t bucket, float alpha,
                                     float* __restrict__ acc) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < n; i += stride) {
    const int code = (codes[i / 4] >> (2 * (i % 4))) & 3;
    const float scale = __fmul_rn(scales[i / bucket], alpha);
    const float unit = static_cast<float>((code & 1) - (code >> 1));
    acc[i] = __fadd_rn(acc[i], __fmul_rn(unit, scale));
  }
}

}  // namespace

cudaError_t LaunchSumOfSquaresTerms(const float* x, size_t n, double* terms,
                                    cudaStream_t stream) {
  const size_t blocks = n / 256;
  if (blocks > 0) {
    const size_t grid = (8 * blocks + kThreads - 1) / kThreads;
    SumOfSquaresKernel<<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(
        x, blocks, terms);
    const cudaError_t error = cudaGetLastError();
    if (error != cudaSuccess) return error;
  }
  TailSquaresKernel<<<1, 1, 0, stream>>>(x, 256 * blocks, n, terms + blocks);
  return cudaGetLastError();
}

cudaError_t LaunchTernGradEncode(const float* x, size_t n, size_t bucket,
                                 float clip, const PhiloxWords& rng,
                                 uint32_t* max_bits, float* scales,
                                 uint8_t* codes, int* nonfinite,
                                 cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const size_t buckets = (n + bucket - 1) / bucket;
  if (bucket % 8 == 0 && bucket <= kFusedBucket &&
      reinterpret_cast<uintptr_t>(x) % 16 == 0) {
    TernGradFusedKernel<<<GridFor(32 * buckets), kThreads, 0, stream>>>(
        x, n, bucket, clip, rng, scales, codes, nonfinite);
    return cudaGetLastError();
  }
  cudaError_t error =
      cudaMemsetAsync(max_bits, 0, buckets * sizeof(uint32_t), stream);
  if (error != cudaSuccess) return error;
  BucketMaxKernel<<<GridFor(n), kThreads, 0, stream>>>(x, n, bucket, max_bits);
  error = cudaGetLastError();
  if (error != cudaSuccess) return error;
  TernGradCodeKernel<<<GridFor((n + 7) / 8), kThreads, 0, stream>>>(
      x, n, bucket, clip, rng, max_bits, scales, codes, nonfinite);
  return cudaGetLastError();
}

cudaError_t LaunchTernGradDecodeAdd(const float* scales, const uint8_t* codes,
                                    size_t n, size_t bucket, float alpha,
                                    float* acc, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  TernGradDecodeKernel<<<GridFor(n), kThreads, 0, stream>>>(scales, codes, n,
                                                            bucket, alpha, acc);
  return cudaGetLastError();
}

}  // namespace gradcomp::codecs::cuda
