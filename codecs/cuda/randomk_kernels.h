// Host entry point of random-k's encoder kernel (randomk.cu). The indices
// are drawn on the host (codecs/cpu/randomk.h DrawRandomKBitmap: Floyd's
// algorithm is one sequential pass); the decoder is decode.h
// LaunchScatterAdd. Pointers are device memory.
//
//   LaunchRandomKGather(d_grad, d_indices, k, scale, d_body, stream);
#ifndef GRADCOMP_CODECS_CUDA_RANDOMK_KERNELS_H_
#define GRADCOMP_CODECS_CUDA_RANDOMK_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace gradcomp::codecs::cuda {

// body[j] = grad[indices[j]] * scale in fp32 (codecs/cpu/randomk.cc Encode)
// for j < k.
cudaError_t LaunchRandomKGather(const float* grad, const uint32_t* indices,
                                size_t k, float scale, float* body,
                                cudaStream_t stream);

}  // namespace gradcomp::codecs::cuda

#endif  // GRADCOMP_CODECS_CUDA_RANDOMK_KERNELS_H_
