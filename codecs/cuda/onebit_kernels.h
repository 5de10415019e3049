// Host entry points of the 1-bit SGD kernels (onebit.cu): the column sums of
// codecs/cpu/onebit.cc summed in parallel, the interval that settles them,
// the CPU's own chains for the columns it does not settle, and the decoder.
// The signs are sign_kernels.h LaunchSignPack's. Every pointer is device
// memory; each call launches on `stream` and returns the launch's error.
//
//   LaunchOneBitColumnSums(d_x, n, columns, d_scratch, d_sums, stream);
//   ... SumIntervalOf(sum, min(OneBitSumTerms(n, columns), side count))
//   settles a mean where it rounds the same at both ends; if not ...
//   LaunchOneBitExactColumns(d_x, n, columns, d_list, count, d_sums, stream);
//   LaunchOneBitDecodeAdd(d_pos, d_neg, columns, d_signs, n, d_acc, stream);
#ifndef GRADCOMP_CODECS_CUDA_ONEBIT_KERNELS_H_
#define GRADCOMP_CODECS_CUDA_ONEBIT_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace gradcomp::codecs::cuda {

// Doubles of scratch LaunchOneBitColumnSums needs for n values in `columns`
// columns (0 for 64 columns or more).
size_t OneBitScratchDoubles(size_t n, size_t columns);

// x seen as [n / columns, columns] (columns >= 1 divides n): per column the
// sum of its values >= 0 (and +-0), of its values < 0, and the count of the
// latter, each a double. The counts are exact; each sum is the CPU's chain
// of OneBitSumTerms(n, columns) terms (codecs/cpu/onebit.cc ColumnSums)
// added in another order, so it may differ in the last bits. sums holds
// 3 * columns doubles: positive sums, then negative sums, then counts; it
// need not be zeroed.
cudaError_t LaunchOneBitColumnSums(const float* x, size_t n, size_t columns,
                                   double* scratch, double* sums,
                                   cudaStream_t stream);

// The length of the double chain onebit.cc sums per column that
// LaunchOneBitColumnSums sums in another order: the rows for 64 columns or
// more, else the chunks' lane sums folded onto a column. At most this many
// of its terms are nonzero, and at most the side's count.
uint64_t OneBitSumTerms(size_t n, size_t columns);

// For 64 columns or more: overwrites the sums of columns list[0, count)
// with onebit.cc's own chains (the CPU's bits), one thread per column
// summing down all rows. InvalidValue for fewer columns.
cudaError_t LaunchOneBitExactColumns(const float* x, size_t n, size_t columns,
                                     const uint32_t* list, size_t count,
                                     double* sums, cudaStream_t stream);

// acc[i] += bit i ? neg[i % columns] : pos[i % columns] (the means already
// multiplied by alpha, as codecs/cpu/onebit.cc DecodeAdd does on the host).
cudaError_t LaunchOneBitDecodeAdd(const float* pos, const float* neg,
                                  size_t columns, const void* signs, size_t n,
                                  float* acc, cudaStream_t stream);

}  // namespace gradcomp::codecs::cuda

#endif  // GRADCOMP_CODECS_CUDA_ONEBIT_KERNELS_H_
