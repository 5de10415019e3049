// The kernels of the GPU PowerSGD codec (codecs/cuda/powersgd.h) that cuBLAS
// does not provide: forming M = g + e, and orthonormalising a tall factor
// the way codecs/cpu/linalg.h OrthonormalizeColumns does.
//
//   LaunchAddArrays(d_grad, d_error, n, d_m, stream);
//   LaunchOrthonormalizeColumns(d_p, rows, rank, d_scratch, d_zero, stream);
#ifndef GRADCOMP_CODECS_CUDA_POWERSGD_KERNELS_H_
#define GRADCOMP_CODECS_CUDA_POWERSGD_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstddef>

namespace gradcomp::codecs::cuda {

// out[i] = a[i] + b[i] for i < n, in fp32; `out` may be `a` or `b`.
cudaError_t LaunchAddArrays(const float* a, const float* b, size_t n,
                            float* out, cudaStream_t stream);

// The largest rank LaunchFormMAndMultiply takes.
inline constexpr size_t kFusedMaxRank = 8;

// One pass over the rows x cols row-major matrices g and e (fp32, device):
//   m = g + e - p_old q_old^T    (the last term only when p_old != nullptr)
//   p = m q
// with m written to `m` (which may be `e`), q cols x rank, p rows x rank,
// p_old rows x rank and q_old cols x rank, all row-major. p_old q_old^T is
// a residual kept in factored form: e_new = M - P_hat Q^T applied to the
// next step's M instead of written out. rank <= kFusedMaxRank; one warp
// per row.
cudaError_t LaunchFormMAndMultiply(const float* g, const float* e,
                                   const float* p_old, const float* q_old,
                                   const float* q, size_t rows, size_t cols,
                                   size_t rank, float* m, float* p,
                                   cudaStream_t stream);

// Orthonormalises the columns of the row-major rows x cols fp32 matrix `a`
// (device memory) in place: OrthonormalizeColumns' algorithm (modified
// Gram-Schmidt left to right, two projection passes per column, in double,
// a column with an exactly zero residual stays zero), in one thread block.
// The sums run in another order than the CPU's, so the result agrees with
// it to double rounding before the final fp32 rounding, not bit for bit.
// `scratch` holds rows * cols doubles; `zero_columns` (one device int, may
// be null) receives the number of zero columns.
cudaError_t LaunchOrthonormalizeColumns(float* a, size_t rows, size_t cols,
                                        double* scratch, int* zero_columns,
                                        cudaStream_t stream);

}  // namespace gradcomp::codecs::cuda

#endif  // GRADCOMP_CODECS_CUDA_POWERSGD_KERNELS_H_
