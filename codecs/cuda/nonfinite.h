// Counts the NaN and Inf values of an fp32 tensor in device memory: the
// count the daemon takes of every input before a reduce
// (service/engine/engine.cc), for the tensors it reduces on the GPU.
//
//   LaunchCountNonfinite(d_values, n, d_count, stream);  // *d_count zeroed
#ifndef GRADCOMP_CODECS_CUDA_NONFINITE_H_
#define GRADCOMP_CODECS_CUDA_NONFINITE_H_

#include <cuda_runtime_api.h>

#include <cstddef>

namespace gradcomp::codecs::cuda {

// Adds to *count (device memory, zeroed by the caller) the number of the n
// values at `x` whose exponent bits are all ones (NaN or Inf). Launches on
// `stream` and returns the launch's error.
cudaError_t LaunchCountNonfinite(const float* x, size_t n,
                                 unsigned long long* count,
                                 cudaStream_t stream);

}  // namespace gradcomp::codecs::cuda

#endif  // GRADCOMP_CODECS_CUDA_NONFINITE_H_
