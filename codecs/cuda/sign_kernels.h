// Host entry points of the sign codecs' kernels (sign.cu): signsgd, signum
// and efsign (codecs/cpu/sign.h), bit for bit. Every pointer is device
// memory; each call launches on `stream` and returns the launch's error.
//
//   LaunchSignPack(d_x, n, d_signs, d_block_sums, stream);
//   LaunchSegmentSums(d_block_sums, blocks, span / 64, d_sums, stream);
//   ... scales on the host (cuda_codec.cc) ...
//   LaunchSignDecodeAdd(d_scales, d_signs, n, span, alpha, d_acc, stream);
#ifndef GRADCOMP_CODECS_CUDA_SIGN_KERNELS_H_
#define GRADCOMP_CODECS_CUDA_SIGN_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace gradcomp::codecs::cuda {

// codecs/cpu/bitpack.h PackSigns: the signs of x[0, n) (bit set for x < 0),
// 64 to a little-endian word, SignBytes(n) bytes at `signs` (4-byte
// aligned), padding bits zero. block_sums[b] (ceil(n / 64) doubles) is the
// sum of block b's 8 fp32 lane sums of |x|, each lane summed as the CPU sums
// it: the terms of PackSigns's double chain, added in another order.
cudaError_t LaunchSignPack(const float* x, size_t n, void* signs,
                           double* block_sums, cudaStream_t stream);

// codecs/cpu/sign.cc SignCodec::DecodeAdd: acc[i] += bit i ? -v : v with
// v = alpha * scales[i / span] (fp32), span >= 1.
cudaError_t LaunchSignDecodeAdd(const float* scales, const void* signs,
                                size_t n, size_t span, float alpha, float* acc,
                                cudaStream_t stream);

// Signum's momentum, m[i] = beta * m[i] + rest * g[i] in fp32 (rest =
// 1 - beta, rounded on the host as the CPU rounds it).
cudaError_t LaunchMomentumUpdate(const float* g, size_t n, float beta,
                                 float rest, float* m, cudaStream_t stream);

}  // namespace gradcomp::codecs::cuda

#endif  // GRADCOMP_CODECS_CUDA_SIGN_KERNELS_H_
