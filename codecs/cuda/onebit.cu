// 1-bit SGD's column sums and decoder (codecs/cpu/onebit.cc), summed in
// parallel. Wide (64 columns or more): the CPU's column chains run down all
// rows; here blocks sum tiles of rows and add them atomically. Narrow: the
// CPU's lane chains (lanes repeated to 64 wide, chunks of 2^16) are short
// and run here in the CPU's order, one thread each; only their fold onto
// the columns is parallel (segment_sums.h). The caller settles each mean by
// SumIntervalOf over OneBitSumTerms terms.
#include <cstddef>
#include <cstdint>

#include "codecs/cuda/onebit_kernels.h"
#include "codecs/cuda/segment_sums.h"

namespace gradcomp::codecs::cuda {
namespace {

constexpr int kThreads = 256;
// codecs/cpu/onebit.cc: lanes at least 64 wide, chunks of 2^16 elements.
constexpr size_t kMinLanes = 64;
constexpr size_t kNarrowChunk = size_t{1} << 16;
// Blocks a wide launch aims at: enough loads in flight to fill the memory
// system, few enough that the per-block atomics stay cheap.
constexpr size_t kTargetBlocks = 1024;
// Rows each thread of a wide block reads at least, so that a block's
// reduction and atomics are amortised over many loads.
constexpr size_t kMinPasses = 16;

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

// Wide: a block covers a tile of `tile` consecutive columns (tile * copies
// <= kThreads) and rows [r0, r1): thread t reads column tile_start + t %
// tile at rows r0 + t / tile, then every `copies` rows, so for tile ==
// columns a block's reads at each pass are one contiguous run. The copies
// are folded in shared memory, then added to the sums (or stored, for a
// single block of rows).
__global__ void TileKernel(const float* __restrict__ x, size_t rows,
                           size_t columns, unsigned tile, unsigned copies,
                           size_t rows_per_block, bool direct,
                           double* __restrict__ sums) {
  __shared__ double s_pos[kThreads];
  __shared__ double s_neg[kThreads];
  __shared__ double s_count[kThreads];
  const unsigned t = threadIdx.x;
  const unsigned q = t / tile;
  const size_t j = static_cast<size_t>(blockIdx.x) * tile + t % tile;
  const size_t r0 = static_cast<size_t>(blockIdx.y) * rows_per_block;
  const size_t r1 = r0 + rows_per_block < rows ? r0 + rows_per_block : rows;
  double pos = 0, neg = 0, negatives = 0;
  if (q < copies && j < columns) {
#pragma unroll 8
    for (size_t r = r0 + q; r < r1; r += copies) {
      Accumulate(x[r * columns + j], pos, neg, negatives);
    }
  }
  s_pos[t] = pos;
  s_neg[t] = neg;
  s_count[t] = negatives;
  __syncthreads();
  for (unsigned live = copies; live > 1;) {
    const unsigned half = (live + 1) / 2;
    if (q < live - half) {
      const unsigned other = t + half * tile;
      s_pos[t] = __dadd_rn(s_pos[t], s_pos[other]);
      s_neg[t] = __dadd_rn(s_neg[t], s_neg[other]);
      s_count[t] = __dadd_rn(s_count[t], s_count[other]);
    }
    __syncthreads();
    live = half;
  }
  if (q != 0 || j >= columns) return;
  // Counts below 2^53 are exact in a double, in any order.
  if (direct) {
    sums[j] = s_pos[t];
    sums[columns + j] = s_neg[t];
    sums[2 * columns + j] = s_count[t];
  } else {
    atomicAdd(sums + j, s_pos[t]);
    atomicAdd(sums + columns + j, s_neg[t]);
    atomicAdd(sums + 2 * columns + j, s_count[t]);
  }
}

// Wide, the CPU's own chains: column list[k] summed down all rows in row
// order (the same bits as onebit.cc), for the columns whose means the
// parallel sums did not settle.
__global__ void ExactColumnsKernel(const float* __restrict__ x, size_t rows,
                                   size_t columns,
                                   const uint32_t* __restrict__ list,
                                   size_t count, double* __restrict__ sums) {
  const size_t k = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= count) return;
  const size_t j = list[k];
  double pos = 0, neg = 0, negatives = 0;
#pragma unroll 8
  for (size_t r = 0; r < rows; ++r) {
    Accumulate(x[r * columns + j], pos, neg, negatives);
  }
  sums[j] = pos;
  sums[columns + j] = neg;
  sums[2 * columns + j] = negatives;
}

// Narrow: per chunk, lane l summed down the chunk's rows of width w (the
// last row of the last chunk may be short), in the CPU's order. Lane l =
// j + k * columns of chunk c lands at ((side * columns + j) * chunks + c) *
// per + k (per = w / columns), so that each (side, column) is one segment.
__global__ void LaneKernel(const float* __restrict__ x, size_t n, size_t w,
                           size_t columns, size_t chunk, size_t chunks,
                           double* __restrict__ partial) {
  const size_t total = chunks * w;
  const size_t per = w / columns;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t t = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       t < total; t += stride) {
    const size_t c = t / w;
    const size_t lane = t % w;
    const size_t c0 = c * chunk;
    const size_t c1 = c0 + chunk < n ? c0 + chunk : n;
    double pos = 0, neg = 0, negatives = 0;
#pragma unroll 16
    for (size_t i = c0 + lane; i < c1; i += w) {
      Accumulate(x[i], pos, neg, negatives);
    }
    const size_t j = lane % columns;
    const size_t k = lane / columns;
    const size_t side = columns * chunks * per;
    const size_t at = (j * chunks + c) * per + k;
    partial[at] = pos;
    partial[side + at] = neg;
    partial[2 * side + at] = negatives;
  }
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

cudaError_t LaunchWide(const float* x, size_t n, size_t columns, double* sums,
                       cudaStream_t stream) {
  const size_t rows = n / columns;
  const unsigned tile =
      static_cast<unsigned>(columns < kThreads ? columns : kThreads);
  const unsigned copies = kThreads / tile;
  const size_t tiles = (columns + tile - 1) / tile;
  if (tiles > 0x7FFFFFFFu) return cudaErrorInvalidValue;
  // Row chunks: about kTargetBlocks blocks in all, each thread reading at
  // least kMinPasses rows (or all of them), at most 65535 chunks.
  size_t chunks = (kTargetBlocks + tiles - 1) / tiles;
  const size_t max_chunks =
      (rows + kMinPasses * copies - 1) / (kMinPasses * copies);
  if (chunks > max_chunks) chunks = max_chunks;
  if (chunks > 65535) chunks = 65535;
  if (chunks < 1) chunks = 1;
  const size_t rows_per_block = (rows + chunks - 1) / chunks;
  chunks = (rows + rows_per_block - 1) / rows_per_block;
  const bool direct = chunks == 1;
  if (!direct) {
    const cudaError_t error =
        cudaMemsetAsync(sums, 0, 3 * sizeof(double) * columns, stream);
    if (error != cudaSuccess) return error;
  }
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(chunks));
  TileKernel<<<grid, kThreads, 0, stream>>>(x, rows, columns, tile, copies,
                                            rows_per_block, direct, sums);
  return cudaGetLastError();
}

}  // namespace

size_t OneBitScratchDoubles(size_t n, size_t columns) {
  if (columns >= kMinLanes || n == 0) return 0;
  const size_t w = LaneWidth(columns);
  const size_t chunk = ChunkOf(w);
  return 3 * w * ((n + chunk - 1) / chunk);
}

uint64_t OneBitSumTerms(size_t n, size_t columns) {
  if (n == 0) return 0;
  if (columns >= kMinLanes) return n / columns;
  const size_t w = LaneWidth(columns);
  const size_t chunk = ChunkOf(w);
  return ((n + chunk - 1) / chunk) * (w / columns);
}

cudaError_t LaunchOneBitColumnSums(const float* x, size_t n, size_t columns,
                                   double* scratch, double* sums,
                                   cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (columns >= kMinLanes) return LaunchWide(x, n, columns, sums, stream);
  const size_t w = LaneWidth(columns);
  const size_t chunk = ChunkOf(w);
  const size_t chunks = (n + chunk - 1) / chunk;
  LaneKernel<<<GridFor(chunks * w), kThreads, 0, stream>>>(
      x, n, w, columns, chunk, chunks, scratch);
  const cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) return error;
  const size_t per_segment = chunks * (w / columns);
  return LaunchSegmentSums(scratch, 3 * columns * per_segment, per_segment,
                           sums, stream);
}

cudaError_t LaunchOneBitExactColumns(const float* x, size_t n, size_t columns,
                                     const uint32_t* list, size_t count,
                                     double* sums, cudaStream_t stream) {
  if (n == 0 || count == 0) return cudaSuccess;
  if (columns < kMinLanes) return cudaErrorInvalidValue;
  ExactColumnsKernel<<<GridFor(count), kThreads, 0, stream>>>(
      x, n / columns, columns, list, count, sums);
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
