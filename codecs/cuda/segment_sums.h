// Sums of nonnegative doubles per segment on the GPU, and the interval that
// holds every other order's sum of the same terms. The CPU codecs sum some
// terms in one long sequential double chain (bitpack.cc PackSigns,
// kernels.cc SumOfSquares); a GPU sums them in parallel, in another order,
// so its sum may differ in the last bits. A value derived from the sum by
// monotone roundings (a scale, a clip) is the CPU's value exactly when it
// is the same at both ends of the interval; otherwise the caller computes
// the CPU's chain itself (sign.cu, terngrad.cu callers in cuda_codec.cc).
//
//   LaunchSegmentSums(d_terms, count, per_segment, d_sums, stream);
//   const SumInterval in = SumIntervalOf(sum, terms);
//   if (Scale(in.lo) == Scale(in.hi)) { /* the CPU's scale */ }
#ifndef GRADCOMP_CODECS_CUDA_SEGMENT_SUMS_H_
#define GRADCOMP_CODECS_CUDA_SEGMENT_SUMS_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace gradcomp::codecs::cuda {

// sums[s] = the sum of in[s * per_segment, min((s + 1) * per_segment,
// count)), in an unspecified order, for the ceil(count / per_segment)
// segments (per_segment >= 1). sums need not be zeroed.
cudaError_t LaunchSegmentSums(const double* in, size_t count,
                              size_t per_segment, double* sums,
                              cudaStream_t stream);

struct SumInterval {
  double lo;
  double hi;
};

// Any summation order of `terms` nonnegative terms has a relative error of
// at most gamma_(terms-1) = (terms-1) u / (1 - (terms-1) u), u = 2^-53
// (Higham, Accuracy and Stability of Numerical Algorithms, 4.2). Two such
// sums differ by at most twice that; the interval is widened to 4 (terms)
// u times `sum`, which also covers the rounding of lo and hi themselves.
// For a finite sum >= 0 and terms < 2^40.
inline SumInterval SumIntervalOf(double sum, uint64_t terms) {
  const double slack = 4.0 * static_cast<double>(terms) * 0x1p-53 * sum;
  return SumInterval{sum - slack, sum + slack};
}

}  // namespace gradcomp::codecs::cuda

#endif  // GRADCOMP_CODECS_CUDA_SEGMENT_SUMS_H_
