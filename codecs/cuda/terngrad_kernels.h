// Host entry points of the TernGrad kernels (terngrad.cu), the body of
// codecs/cpu/terngrad.h bit for bit. Every pointer is device memory; each
// call launches on `stream` and returns the launch's error.
//
//   LaunchSumOfSquaresTerms(d_x, n, d_terms, stream);   // clip_sigma > 0
//   ... the clip on the host (cuda_codec.cc) ...
//   LaunchTernGradEncode(d_x, n, bucket, clip, rng, d_max_bits, d_scales,
//                        d_codes, d_nonfinite, stream);
#ifndef GRADCOMP_CODECS_CUDA_TERNGRAD_KERNELS_H_
#define GRADCOMP_CODECS_CUDA_TERNGRAD_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "codecs/cuda/kernels.h"

namespace gradcomp::codecs::cuda {

// The terms of codecs/cpu/kernels.h SumOfSquares's double chain, in another
// order: terms[b] (b < n / 256) is the sum of 256-element block b's 8 fp32
// lane sums of squares, each lane summed as the CPU sums it; terms[n / 256]
// is the sum of the tail's squares in double. n / 256 + 1 doubles.
cudaError_t LaunchSumOfSquaresTerms(const float* x, size_t n, double* terms,
                                    cudaStream_t stream);

// The body: ceil(n / bucket) fp32 scales at `scales` (4-byte aligned), then
// ceil(n / 4) bytes of 2-bit codes at `codes` (2-byte aligned); `clip` +inf
// when clipping is off. Sets *nonfinite (zeroed by the caller) when a
// bucket holds NaN or Inf. Buckets of a multiple of 8 up to 1024 values
// over a 16-byte aligned x read x once (a warp per bucket); others take a
// pass for the buckets' largest |x| into max_bits (ceil(n / bucket) words
// of scratch), then one for the codes.
cudaError_t LaunchTernGradEncode(const float* x, size_t n, size_t bucket,
                                 float clip, const PhiloxWords& rng,
                                 uint32_t* max_bits, float* scales,
                                 uint8_t* codes, int* nonfinite,
                                 cudaStream_t stream);

// codecs/cpu/terngrad.cc DecodeAdd: acc[i] += float(+1, -1 or 0) * (scale
// of i's bucket * alpha), for checked scales and codes.
cudaError_t LaunchTernGradDecodeAdd(const float* scales, const uint8_t* codes,
                                    size_t n, size_t bucket, float alpha,
                                    float* acc, cudaStream_t stream);

}  // namespace gradcomp::codecs::cuda

#endif  // GRADCOMP_CODECS_CUDA_TERNGRAD_KERNELS_H_
