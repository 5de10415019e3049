// The qsgd codec's body: per bucket the fp32 L2 norm, then bit-packed codes
// (level | sign << (bits - 1)), as codecs/cpu/qsgd.cc computes them.
#include <cstddef>
#include <cstdint>

#include "codecs/cuda/groups.cuh"
#include "codecs/cuda/kernels.h"
#include "codecs/cuda/philox.cuh"

namespace gradcomp::codecs::cuda {
namespace {

constexpr int kThreads = 256;
// codecs/cpu/kernels.cc BucketSumOfSquares sums in 8 fp32 lanes; here each
// lane is a thread, so 8 threads share a bucket and 32 buckets share a block.
constexpr int kLanes = 8;

// Any bucket size: the norms, 8 threads per bucket.
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
    int nonzero = 0;
    for (size_t i = lane; i < laned; i += kLanes) {
      const float v = x[b0 + i];
      sum = __fadd_rn(sum, __fmul_rn(v, v));
      nonzero |= v != 0;
    }
    // Lanes fold in order 0..7, then the tail, as on the CPU.
    float total = 0;
    for (int j = 0; j < kLanes; ++j) {
      total = __fadd_rn(total, __shfl_sync(0xFFFFFFFFu, sum, j, kLanes));
      nonzero |= __shfl_sync(0xFFFFFFFFu, nonzero, j, kLanes);
    }
    if (!live || lane != 0) continue;
    for (size_t i = laned; i < len; ++i) {
      const float v = x[b0 + i];
      total = __fadd_rn(total, __fmul_rn(v, v));
      nonzero |= v != 0;
    }
    float norm = __fsqrt_rn(total);
    const float scale = __fdiv_rn(levels, norm);
    // Not finite, or tiny where the CPU sums in double: the host encodes.
    if (!isfinite(norm) || (total < kTinySumOfSquares && nonzero)) {
      atomicOr(nonfinite, 1);
    }
    if (!isfinite(scale) || !isfinite(norm)) norm = 0;
    norms[b] = norm;
  }
}

// The code of x (level | sign << (bits - 1)) in a bucket of nonzero
// `scale` = levels / norm, rounding up with probability `uniform`.
__device__ uint32_t QsgdCode(float x, float scale, float uniform, int levels,
                             uint32_t sign) {
  const float raised = __fadd_rn(__fmul_rn(fabsf(x), scale), uniform);
  const int raised_level = static_cast<int>(raised);
  const uint32_t level =
      static_cast<uint32_t>(raised_level < levels ? raised_level : levels);
  return level | (signbit(x) ? sign : 0u);
}

// Any bucket size, after QsgdNormKernel: one thread per group of 8 codes
// (they share a Philox block and fill exactly `bits` bytes).
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
      packed |= static_cast<uint64_t>(
                    QsgdCode(x[i], scale, ToUniform(words[j]), levels, sign))
                << (bits * j);
    }
    uint8_t* out = codes + g * bits;
    const size_t bytes = (count * bits + 7) / 8;
    for (size_t k = 0; k < bytes; ++k) {
      out[k] = static_cast<uint8_t>(packed >> (8 * k));
    }
  }
}

// One pass for buckets of 256..2048 values that are a multiple of 256: a
// block holds the whole buckets of a tile of 2048 values, a thread one group
// of 8 in registers (and its squares in shared memory). Eight threads per
// bucket sum the squares in the CPU's lane order from shared memory, then
// every thread quantises its group from registers: the input is read once.
constexpr uint32_t kTile = kGroupThreads * kGroup;
// Each bucket's squares are followed by 8 unused floats, so the 8 lanes of
// 4 buckets that one warp sums fall in 32 different shared-memory banks.
constexpr uint32_t kPad = 8;
constexpr uint32_t kMaxTileBuckets = kTile / 256;

// Launch bounds of 32 registers: 8 blocks per SM keep enough loads in flight
// while other blocks reduce or draw Philox numbers.
__global__ void __launch_bounds__(kGroupThreads, 8)
    QsgdTileKernel(const float* __restrict__ x, size_t n, uint32_t bucket,
                   int bits, bool aligned, PhiloxWords rng,
                   float* __restrict__ norms, uint8_t* __restrict__ codes,
                   int* nonfinite) {
  __shared__ __align__(16) float squares[kTile + kMaxTileBuckets * kPad];
  __shared__ float lane_sums[kMaxTileBuckets * kLanes];
  __shared__ float bucket_scale[kMaxTileBuckets];
  // Whether a bucket holds a value other than zero: a tiny sum of squares
  // then sends it to the host (LaunchQsgdEncode).
  __shared__ int bucket_nonzero[kMaxTileBuckets];
  if (threadIdx.x < kMaxTileBuckets) bucket_nonzero[threadIdx.x] = 0;
  __syncthreads();
  const int levels = (1 << (bits - 1)) - 1;
  const uint32_t per_tile = kTile / bucket;
  const size_t first_bucket = static_cast<size_t>(blockIdx.x) * per_tile;
  const uint32_t local = threadIdx.x * kGroup;  // offset in the tile
  const size_t i0 = first_bucket * bucket + local;
  const int count =
      local < per_tile * bucket && i0 < n ? GroupCount(n, i0 / kGroup) : 0;
  float v[kGroup];
  LoadGroup(x, i0, count, aligned, v);
  if (count > 0) {
    float s[kGroup];
    int nonzero = 0;
    for (int j = 0; j < kGroup; ++j) {
      s[j] = __fmul_rn(v[j], v[j]);
      nonzero |= j < count && v[j] != 0;
    }
    StoreGroup(squares + local + local / bucket * kPad, 0, kGroup, true, s);
    if (nonzero) bucket_nonzero[local / bucket] = 1;
  }
  __syncthreads();
  // codecs/cpu/kernels.cc BucketSumOfSquares: lane j sums values j, j + 8,
  // ... of the bucket's whole groups in order; the lanes fold 0..7, then the
  // tail of a last, partial group follows in order.
  const uint32_t q = threadIdx.x / kLanes;
  const size_t b = first_bucket + q;
  const size_t len = q < per_tile && b * bucket < n
                         ? (n - b * bucket < bucket ? n - b * bucket : bucket)
                         : 0;
  const float* bucket_squares = squares + q * (bucket + kPad);
  if (threadIdx.x < per_tile * kLanes) {
    float sum = 0;
#pragma unroll 8
    for (size_t i = threadIdx.x % kLanes; i < len - len % kLanes; i += kLanes) {
      sum = __fadd_rn(sum, bucket_squares[i]);
    }
    lane_sums[threadIdx.x] = sum;
  }
  __syncthreads();
  if (threadIdx.x < per_tile * kLanes && threadIdx.x % kLanes == 0 && len > 0) {
    float total = 0;
    for (int j = 0; j < kLanes; ++j) {
      total = __fadd_rn(total, lane_sums[threadIdx.x + j]);
    }
    for (size_t i = len - len % kLanes; i < len; ++i) {
      total = __fadd_rn(total, bucket_squares[i]);
    }
    float norm = __fsqrt_rn(total);
    float scale = __fdiv_rn(static_cast<float>(levels), norm);
    // Not finite, or tiny where the CPU sums in double: the host encodes.
    if (!isfinite(norm) || (total < kTinySumOfSquares && bucket_nonzero[q])) {
      atomicOr(nonfinite, 1);
    }
    if (!isfinite(scale) || !isfinite(norm)) norm = scale = 0;
    norms[b] = norm;
    bucket_scale[q] = scale;
  }
  __syncthreads();
  if (count == 0) return;
  const float scale = bucket_scale[local / bucket];
  uint64_t packed = 0;
  if (scale != 0) {  // the CPU writes 0 for a zeroed bucket
    uint32_t words[kGroup];
    PhiloxBlock(rng, i0 / kGroup, words);
    const uint32_t sign = 1u << (bits - 1);
#pragma unroll
    for (int j = 0; j < kGroup; ++j) {
      if (j == count) break;  // a last, partial group
      packed |= static_cast<uint64_t>(
                    QsgdCode(v[j], scale, ToUniform(words[j]), levels, sign))
                << (bits * j);
    }
  }
  StoreBytes(codes + i0 / kGroup * bits, packed, (count * bits + 7) / 8);
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
  float* norm_values = static_cast<float*>(norms);
  const size_t tile = bucket <= kTile ? kTile / bucket * bucket : 0;
  if (bucket % 256 == 0 && tile != 0 && (n + tile - 1) / tile <= INT32_MAX) {
    const size_t tiles = (n + tile - 1) / tile;
    QsgdTileKernel<<<static_cast<unsigned>(tiles), kGroupThreads, 0, stream>>>(
        x, n, static_cast<uint32_t>(bucket), bits, Aligned16(x), rng,
        norm_values, codes, nonfinite);
    return cudaGetLastError();
  }
  const size_t buckets = (n + bucket - 1) / bucket;
  const float levels = static_cast<float>((1 << (bits - 1)) - 1);
  QsgdNormKernel<<<BlocksFor(buckets * kLanes), kThreads, 0, stream>>>(
      x, n, bucket, levels, norm_values, nonfinite);
  const cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) return error;
  QsgdCodeKernel<<<BlocksFor((n + 7) / 8), kThreads, 0, stream>>>(
      x, n, bucket, bits, rng, norm_values, codes);
  return cudaGetLastError();
}

}  // namespace gradcomp::codecs::cuda
