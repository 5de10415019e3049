// Random-k's gather (codecs/cpu/randomk.cc Encode).
#include <cstddef>
#include <cstdint>

#include "codecs/cuda/randomk_kernels.h"

namespace gradcomp::codecs::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void GatherKernel(const float* __restrict__ grad,
                             const uint32_t* __restrict__ indices, size_t k,
                             float scale, float* __restrict__ body) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t j = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       j < k; j += stride) {
    body[j] = __fmul_rn(grad[indices[j]], scale);
  }
}

}  // namespace

cudaError_t LaunchRandomKGather(const float* grad, const uint32_t* indices,
                                size_t k, float scale, float* body,
                                cudaStream_t stream) {
  if (k == 0) return cudaSuccess;
  const size_t blocks = (k + kThreads - 1) / kThreads;
  GatherKernel<<<static_cast<unsigned>(blocks < 65536 ? blocks : 65536),
                 kThreads, 0, stream>>>(grad, indices, k, scale, body);
  return cudaGetLastError();
}

}  // namespace gradcomp::codecs::cuda
