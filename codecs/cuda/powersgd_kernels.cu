#include <cub/block/block_reduce.cuh>

#include "codecs/cuda/powersgd_kernels.h"

namespace gradcomp::codecs::cuda {
namespace {

constexpr int kAddThreads = 256;
constexpr int kOrthThreads = 1024;

__global__ void AddArraysKernel(const float* a, const float* b, size_t n,
                                float* out) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < n; i += stride) {
    out[i] = __fadd_rn(a[i], b[i]);
  }
}

constexpr int kFusedWarps = 8;

template <bool kLazy>
__global__ void FormMAndMultiplyKernel(const float* g, const float* e,
                                       const float* p_old, const float* q_old,
                                       const float* q, size_t rows, size_t cols,
                                       int rank, float* m, float* p) {
  const int lane = threadIdx.x % 32;
  const size_t warp =
      (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const size_t warps = static_cast<size_t>(gridDim.x) * blockDim.x / 32;
  for (size_t row = warp; row < rows; row += warps) {
    float old[kFusedMaxRank] = {};
    if (kLazy) {
      for (int k = 0; k < rank; ++k) old[k] = p_old[row * rank + k];
    }
    float acc[kFusedMaxRank] = {};
    const float* g_row = g + row * cols;
    const float* e_row = e + row * cols;
    float* m_row = m + row * cols;
    for (size_t j = lane; j < cols; j += 32) {
      float v = __fadd_rn(g_row[j], e_row[j]);
      if (kLazy) {
        float low = 0;
#pragma unroll
        for (int k = 0; k < kFusedMaxRank; ++k) {
          if (k < rank)
            low = __fadd_rn(low, __fmul_rn(old[k], q_old[j * rank + k]));
        }
        v = __fsub_rn(v, low);
      }
      m_row[j] = v;
#pragma unroll
      for (int k = 0; k < kFusedMaxRank; ++k) {
        if (k < rank) acc[k] = __fadd_rn(acc[k], __fmul_rn(v, q[j * rank + k]));
      }
    }
#pragma unroll
    for (int k = 0; k < kFusedMaxRank; ++k) {
      if (k < rank) {
        float s = acc[k];
        for (int offset = 16; offset > 0; offset /= 2) {
          s += __shfl_down_sync(0xffffffffu, s, offset);
        }
        if (lane == 0) p[row * rank + k] = s;
      }
    }
  }
}

using BlockSum = cub::BlockReduce<double, kOrthThreads>;

// The sum over the block of every thread's `value`, seen by all threads.
__device__ double BlockTotal(double value, BlockSum::TempStorage& storage,
                             double* shared) {
  const double total = BlockSum(storage).Sum(value);
  if (threadIdx.x == 0) *shared = total;
  __syncthreads();
  const double result = *shared;
  __syncthreads();
  return result;
}

__global__ void OrthonormalizeKernel(float* a, size_t rows, size_t cols,
                                     double* m, int* zero_columns) {
  __shared__ BlockSum::TempStorage storage;
  __shared__ double shared;
  const size_t n = rows * cols;
  for (size_t i = threadIdx.x; i < n; i += blockDim.x) m[i] = a[i];
  __syncthreads();
  int zeros = 0;
  for (size_t j = 0; j < cols; ++j) {
    for (int pass = 0; pass < 2; ++pass) {
      for (size_t k = 0; k < j; ++k) {
        double part = 0;
        for (size_t i = threadIdx.x; i < rows; i += blockDim.x) {
          part += m[i * cols + k] * m[i * cols + j];
        }
        const double dot = BlockTotal(part, storage, &shared);
        for (size_t i = threadIdx.x; i < rows; i += blockDim.x) {
          m[i * cols + j] -= dot * m[i * cols + k];
        }
        __syncthreads();
      }
    }
    double part = 0;
    for (size_t i = threadIdx.x; i < rows; i += blockDim.x) {
      part += m[i * cols + j] * m[i * cols + j];
    }
    const double norm2 = BlockTotal(part, storage, &shared);
    if (norm2 > 0) {
      const double inv = 1.0 / sqrt(norm2);
      for (size_t i = threadIdx.x; i < rows; i += blockDim.x) {
        m[i * cols + j] *= inv;
      }
    } else {
      ++zeros;
    }
    __syncthreads();
  }
  for (size_t i = threadIdx.x; i < n; i += blockDim.x) {
    a[i] = static_cast<float>(m[i]);
  }
  if (threadIdx.x == 0 && zero_columns != nullptr) *zero_columns = zeros;
}

}  // namespace

cudaError_t LaunchAddArrays(const float* a, const float* b, size_t n,
                            float* out, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const size_t blocks = (n + kAddThreads - 1) / kAddThreads;
  const unsigned grid =
      static_cast<unsigned>(blocks < 65536 * 8 ? blocks : 65536 * 8);
  AddArraysKernel<<<grid, kAddThreads, 0, stream>>>(a, b, n, out);
  return cudaGetLastError();
}

cudaError_t LaunchFormMAndMultiply(const float* g, const float* e,
                                   const float* p_old, const float* q_old,
                                   const float* q, size_t rows, size_t cols,
                                   size_t rank, float* m, float* p,
                                   cudaStream_t stream) {
  if (rank == 0 || rank > kFusedMaxRank) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  const size_t blocks = (rows + kFusedWarps - 1) / kFusedWarps;
  const unsigned grid =
      static_cast<unsigned>(blocks < 65536 * 8 ? blocks : 65536 * 8);
  if (p_old != nullptr) {
    FormMAndMultiplyKernel<true><<<grid, 32 * kFusedWarps, 0, stream>>>(
        g, e, p_old, q_old, q, rows, cols, static_cast<int>(rank), m, p);
  } else {
    FormMAndMultiplyKernel<false><<<grid, 32 * kFusedWarps, 0, stream>>>(
        g, e, nullptr, nullptr, q, rows, cols, static_cast<int>(rank), m, p);
  }
  return cudaGetLastError();
}

cudaError_t LaunchOrthonormalizeColumns(float* a, size_t rows, size_t cols,
                                        double* scratch, int* zero_columns,
                                        cudaStream_t stream) {
  OrthonormalizeKernel<<<1, kOrthThreads, 0, stream>>>(a, rows, cols, scratch,
                                                       zero_columns);
  return cudaGetLastError();
}

}  // namespace gradcomp::codecs::cuda
