// The int8 codec's body: per bucket the fp32 (min, max) and one level byte
// per value, as codecs/cpu/int8.cc computes them.
#include <cfloat>
#include <cstddef>
#include <cstdint>

#include "codecs/cuda/groups.cuh"
#include "codecs/cuda/kernels.h"
#include "codecs/cuda/philox.cuh"

namespace gradcomp::codecs::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// The CPU scans a bucket in order and keeps the first of equal values, which
// matters for -0 and +0: ties go to the lower index here too, so the min and
// max bytes match whatever order the threads meet in.
struct Extremes {
  float lo;
  uint32_t lo_at;
  float hi;
  uint32_t hi_at;
  int bad;  // NaN or Inf seen
};

__device__ Extremes Combine(Extremes a, Extremes b) {
  Extremes r = a;
  if (b.lo < a.lo || (b.lo == a.lo && b.lo_at < a.lo_at)) {
    r.lo = b.lo;
    r.lo_at = b.lo_at;
  }
  if (b.hi > a.hi || (b.hi == a.hi && b.hi_at < a.hi_at)) {
    r.hi = b.hi;
    r.hi_at = b.hi_at;
  }
  r.bad = a.bad | b.bad;
  return r;
}

__device__ Extremes Shuffled(const Extremes& e, int offset) {
  constexpr unsigned kAll = 0xFFFFFFFFu;
  return Extremes{__shfl_down_sync(kAll, e.lo, offset),
                  __shfl_down_sync(kAll, e.lo_at, offset),
                  __shfl_down_sync(kAll, e.hi, offset),
                  __shfl_down_sync(kAll, e.hi_at, offset),
                  __shfl_down_sync(kAll, e.bad, offset)};
}

// The block's (min, max, bad) of x[0, len); every thread gets the result.
__device__ Extremes BlockExtremes(const float* x, size_t len) {
  __shared__ Extremes warp_results[kWarps];
  Extremes e{FLT_MAX, UINT32_MAX, -FLT_MAX, UINT32_MAX, 0};
  for (size_t i = threadIdx.x; i < len; i += blockDim.x) {
    const float v = x[i];
    if (!isfinite(v)) {
      e.bad = 1;
      continue;
    }
    const uint32_t at = static_cast<uint32_t>(i);
    e = Combine(e, Extremes{v, at, v, at, 0});
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    e = Combine(e, Shuffled(e, offset));
  }
  if (threadIdx.x % 32 == 0) warp_results[threadIdx.x / 32] = e;
  __syncthreads();
  Extremes all = warp_results[0];
  for (int w = 1; w < kWarps; ++w) all = Combine(all, warp_results[w]);
  __syncthreads();  // warp_results is reused by the next bucket
  return all;
}

// codecs/cpu/int8.cc ScaleOf and EncodeRange: the range in double, and the
// level from (x - lo) * inverse, both halved where the range passes
// FLT_MAX (half = 0.5, lo_half = lo / 2, inverse_half = 2 inverse).
struct BucketScale {
  float inverse;  // 0 for a constant bucket
  float half;
  float lo_half;
  float inverse_half;
};

__device__ BucketScale ScaleOf(float lo, float hi) {
  const double range = static_cast<double>(hi) - static_cast<double>(lo);
  float inverse = range > 0 ? static_cast<float>(255.0 / range) : 0.0f;
  if (!isfinite(inverse)) inverse = 0;
  const float unit = range > static_cast<double>(FLT_MAX) ? 2.0f : 1.0f;
  const float half = __fdiv_rn(1.0f, unit);
  return BucketScale{inverse, half, __fmul_rn(lo, half),
                     __fmul_rn(inverse, unit)};
}

// The level byte of x in a bucket of scale `s` (s.inverse != 0), rounding
// up with probability `add` - 0.5 (0.5: nearest).
__device__ uint8_t Int8Level(float x, const BucketScale& s, float add) {
  const float level = __fadd_rn(
      fmaxf(
          __fmul_rn(__fsub_rn(__fmul_rn(x, s.half), s.lo_half), s.inverse_half),
          0.0f),
      add);
  return static_cast<uint8_t>(fminf(level, 255.0f));
}

// Any bucket size: a block per bucket, which it reads twice.
__global__ void Int8EncodeKernel(const float* __restrict__ x, size_t n,
                                 size_t bucket, PhiloxWords rng,
                                 bool stochastic, float* __restrict__ ranges,
                                 uint8_t* __restrict__ codes, int* nonfinite) {
  const size_t buckets = (n + bucket - 1) / bucket;
  for (size_t b = blockIdx.x; b < buckets; b += gridDim.x) {
    const size_t b0 = b * bucket;
    const size_t b1 = b0 + bucket < n ? b0 + bucket : n;
    Extremes e = BlockExtremes(x + b0, b1 - b0);
    if (e.bad) {
      e.lo = e.hi = 0;
      if (threadIdx.x == 0) atomicOr(nonfinite, 1);
    }
    if (threadIdx.x == 0) {
      ranges[2 * b] = e.lo;
      ranges[2 * b + 1] = e.hi;
    }
    const BucketScale scale = ScaleOf(e.lo, e.hi);
    const float inverse = scale.inverse;
    // One thread per group of 8 elements that shares a Philox block.
    const size_t g0 = b0 / 8;
    const size_t g1 = (b1 + 7) / 8;
    for (size_t g = g0 + threadIdx.x; g < g1; g += blockDim.x) {
      uint32_t words[8];
      if (stochastic && inverse != 0) PhiloxBlock(rng, g, words);
      const size_t i0 = 8 * g > b0 ? 8 * g : b0;
      const size_t i1 = 8 * g + 8 < b1 ? 8 * g + 8 : b1;
      for (size_t i = i0; i < i1; ++i) {
        if (inverse == 0) {
          codes[i] = 0;
          continue;
        }
        const float add = stochastic ? ToUniform(words[i % 8]) : 0.5f;
        codes[i] = Int8Level(x[i], scale, add);
      }
    }
  }
}

// One pass for buckets of 256..2048 values that are a multiple of 256: a
// block holds the whole buckets of a tile of 2048 values, a thread one group
// of 8 in registers, and each warp lies inside one bucket. The block reduces
// each bucket's (min, max) and quantises from the registers, so the input is
// read once.
constexpr uint32_t kTile = kGroupThreads * kGroup;
constexpr int kTileWarps = kGroupThreads / 32;

// Launch bounds of 32 registers: 8 blocks per SM keep enough loads in flight
// while other blocks reduce or draw Philox numbers.
__global__ void __launch_bounds__(kGroupThreads, 8)
    Int8TileKernel(const float* __restrict__ x, size_t n, uint32_t bucket,
                   bool aligned, PhiloxWords rng, bool stochastic,
                   float* __restrict__ ranges, uint8_t* __restrict__ codes,
                   int* nonfinite) {
  __shared__ Extremes warp_results[kTileWarps];
  // At most kTile / 256 buckets per tile.
  __shared__ BucketScale bucket_scale[kTileWarps];
  const uint32_t per_tile = kTile / bucket;
  const size_t first_bucket = static_cast<size_t>(blockIdx.x) * per_tile;
  const uint32_t local = threadIdx.x * kGroup;  // offset in the tile
  const size_t i0 = first_bucket * bucket + local;
  const int count =
      local < per_tile * bucket && i0 < n ? GroupCount(n, i0 / kGroup) : 0;
  float v[kGroup];
  LoadGroup(x, i0, count, aligned, v);
  Extremes e{FLT_MAX, UINT32_MAX, -FLT_MAX, UINT32_MAX, 0};
#pragma unroll
  for (int j = 0; j < kGroup; ++j) {
    if (j == count) break;  // a last, partial group
    if (!isfinite(v[j])) {
      e.bad = 1;
      continue;
    }
    const uint32_t at = local + j;
    e = Combine(e, Extremes{v[j], at, v[j], at, 0});
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    e = Combine(e, Shuffled(e, offset));
  }
  if (threadIdx.x % 32 == 0) warp_results[threadIdx.x / 32] = e;
  __syncthreads();
  if (threadIdx.x < per_tile) {
    const uint32_t q = threadIdx.x;
    const uint32_t warps_per_bucket = bucket / (32 * kGroup);
    Extremes all = warp_results[q * warps_per_bucket];
    for (uint32_t w = 1; w < warps_per_bucket; ++w) {
      all = Combine(all, warp_results[q * warps_per_bucket + w]);
    }
    const size_t b = first_bucket + q;
    if (b * bucket < n) {
      if (all.bad) {
        all.lo = all.hi = 0;
        atomicOr(nonfinite, 1);
      }
      ranges[2 * b] = all.lo;
      ranges[2 * b + 1] = all.hi;
    }
    bucket_scale[q] = ScaleOf(all.lo, all.hi);
  }
  __syncthreads();
  if (count == 0) return;
  const BucketScale scale = bucket_scale[local / bucket];
  uint64_t packed = 0;
  if (scale.inverse != 0) {
    uint32_t words[kGroup];
    if (stochastic) PhiloxBlock(rng, i0 / kGroup, words);
#pragma unroll
    for (int j = 0; j < kGroup; ++j) {
      if (j == count) break;  // a last, partial group
      const float add = stochastic ? ToUniform(words[j]) : 0.5f;
      packed |= static_cast<uint64_t>(Int8Level(v[j], scale, add)) << (8 * j);
    }
  }
  StoreBytes(codes + i0, packed, count);
}

}  // namespace

cudaError_t LaunchInt8Encode(const float* x, size_t n, size_t bucket,
                             const PhiloxWords* rng, void* ranges,
                             uint8_t* codes, int* nonfinite,
                             cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const PhiloxWords words = rng != nullptr ? *rng : PhiloxWords{};
  const size_t tile = bucket <= kTile ? kTile / bucket * bucket : 0;
  if (bucket % 256 == 0 && tile != 0 && (n + tile - 1) / tile <= INT32_MAX) {
    const size_t tiles = (n + tile - 1) / tile;
    Int8TileKernel<<<static_cast<unsigned>(tiles), kGroupThreads, 0, stream>>>(
        x, n, static_cast<uint32_t>(bucket), Aligned16(x), words,
        rng != nullptr, static_cast<float*>(ranges), codes, nonfinite);
    return cudaGetLastError();
  }
  const size_t buckets = (n + bucket - 1) / bucket;
  const unsigned blocks =
      static_cast<unsigned>(buckets < 65536 ? buckets : 65536);
  Int8EncodeKernel<<<blocks, kThreads, 0, stream>>>(
      x, n, bucket, words, rng != nullptr, static_cast<float*>(ranges), codes,
      nonfinite);
  return cudaGetLastError();
}

}  // namespace gradcomp::codecs::cuda
