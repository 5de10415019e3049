// 1-bit SGD's column sums and decoder (codecs/cpu/onebit.cc). The CPU sums
// each column (or lane) in one sequential double chain; here one thread runs
// each chain in the same order, so the sums are the CPU's bits.
#include <cstddef>
#include <cstdint>

#include "codecs/cuda/onebit_kernels.h"

namespace gradcomp::codecs::cuda {
namespace {

constexpr int kThreads = 256;
// codecs/cpu/onebit.cc: lanes at least 64 wide, chunks of 2^16 elements.
constexpr size_t kMinLanes = 64;
constexpr size_t kNarrowChunk = size_t{1} << 16;

size_t LaneWidth(size_t columns) {
  return columns >= kMinLanes ? columns
                              : columns * ((kMinLanes + columns - 1) / columns);
}

size_t ChunkOf(size_t w) {
  const size_t rows = kNarrowChunk / w;
  return (rows > 0 ? rows : 1) * w;
}

unsigned GridFor(size_t threads) {
  const size_t blocks = (threads + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65536 ? (blocks > 0 ? blocks : 1)
                                              : 65536);
}

// onebit.cc AccumulateRows for one value: split by its bits (above
// 0x80000000: negative, -0 not), the parts added to double sums.
__device__ void Accumulate(float v, double& pos, double& neg,
                           double& negatives) {
  const uint32_t bits = __float_as_uint(v);
  const uint32_t negative = bits > 0x80000000u ? ~0u : 0u;
  pos = __dadd_rn(pos, __uint_as_float(bits & ~negative));
  neg = __dadd_rn(neg, __uint_as_float(bits & negative));
  negatives = __dadd_rn(negatives, static_cast<double>(negative & 1u));
}

// Wide (64 columns or more): column j summed down all rows.
__global__ void WideKernel(const float* __restrict__ x, size_t rows,
                           size_t columns, double* __restrict__ sums) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t j = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       j < columns; j += stride) {
    double pos = 0, neg = 0, negatives = 0;
    // Unrolled so that several rows' loads are in flight; the sums stay
    // one chain each.
#pragma unroll 8
    for (size_t r = 0; r < rows; ++r) {
      Accumulate(x[r * columns + j], pos, neg, negatives);
    }
    sums[j] = pos;
    sums[columns + j] = neg;
    sums[2 * columns + j] = negatives;
  }
}

// Narrow, first half: per chunk, lane l summed down the chunk's rows of
// width w (the last row of the last chunk may be short).
__global__ void LaneKernel(const float* __restrict__ x, size_t n, size_t w,
                           size_t chunk, size_t chunks,
                           double* __restrict__ partial) {
  const size_t total = chunks * w;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t t = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       t < total; t += stride) {
    const size_t c = t / w;
    const size_t lane = t % w;
    const size_t c0 = c * chunk;
    const size_t c1 = c0 + chunk < n ? c0 + chunk : n;
    double pos = 0, neg = 0, negatives = 0;
#pragma unroll 8
    for (size_t i = c0 + lane; i < c1; i += w) {
      Accumulate(x[i], pos, neg, negatives);
    }
    partial[3 * t] = pos;
    partial[3 * t + 1] = neg;
    partial[3 * t + 2] = negatives;
  }
}

// Narrow, second half: column j adds its lanes (j, j + columns, ...) of each
// chunk, chunks in order, as the CPU folds them.
__global__ void FoldKernel(const double* __restrict__ partial, size_t w,
                           size_t chunks, size_t columns,
                           double* __restrict__ sums) {
  const size_t j = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= columns) return;
  double pos = 0, neg = 0, negatives = 0;
  for (size_t c = 0; c < chunks; ++c) {
    for (size_t lane = j; lane < w; lane += columns) {
      const double* p = partial + 3 * (c * w + lane);
      pos = __dadd_rn(pos, p[0]);
      neg = __dadd_rn(neg, p[1]);
      negatives = __dadd_rn(negatives, p[2]);
    }
  }
  sums[j] = pos;
  sums[columns + j] = neg;
  sums[2 * columns + j] = negatives;
}

__global__ void DecodeKernel(const float* __restrict__ pos,
                             const float* __restrict__ neg, size_t columns,
                             const uint32_t* __restrict__ signs, size_t n,
                             float* __restrict__ acc) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < n; i += stride) {
    const bool negative = (signs[i / 32] >> (i % 32)) & 1u;
    const size_t j = i % columns;
    acc[i] = __fadd_rn(acc[i], negative ? neg[j] : pos[j]);
  }
}

}  // namespace

size_t OneBitScratchDoubles(size_t n, size_t columns) {
  if (columns >= kMinLanes || n == 0) return 0;
  const size_t w = LaneWidth(columns);
  const size_t chunk = ChunkOf(w);
  return 3 * w * ((n + chunk - 1) / chunk);
}

cudaError_t LaunchOneBitColumnSums(const float* x, size_t n, size_t columns,
                                   double* scratch, double* sums,
                                   cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (columns >= kMinLanes) {
    WideKernel<<<GridFor(columns), kThreads, 0, stream>>>(x, n / columns,
                                                          columns, sums);
    return cudaGetLastError();
  }
  const size_t w = LaneWidth(columns);
  const size_t chunk = ChunkOf(w);
  const size_t chunks = (n + chunk - 1) / chunk;
  LaneKernel<<<GridFor(chunks * w), kThreads, 0, stream>>>(x, n, w, chunk,
                                                           chunks, scratch);
  const cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) return error;
  FoldKernel<<<GridFor(columns), kThreads, 0, stream>>>(scratch, w, chunks,
                                                        columns, sums);
  return cudaGetLastError();
}

cudaError_t LaunchOneBitDecodeAdd(const float* pos, const float* neg,
                                  size_t columns, const void* signs, size_t n,
                                  float* acc, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  DecodeKernel<<<GridFor(n), kThreads, 0, stream>>>(
      pos, neg, columns, static_cast<const uint32_t*>(signs), n, acc);
  return cudaGetLastError();
}

}  // namespace gradcomp::codecs::cuda
