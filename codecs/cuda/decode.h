// Host entry points of the GPU decoders (decode.cu): acc (n fp32 values in
// device memory) += alpha * the decoded body, with the CPU decoder's
// arithmetic (the same fp32 operations in the same order, none fused), so
// the sums are the CPU's bits for payloads without NaN. The caller checks
// the payload first (cuda_codec.cc); the pointers are the parts of its body
// copied to device memory. Each call launches on `stream` and returns the
// launch's error.
//
//   LaunchAddHalf(d_body, n, alpha, d_acc, stream);
#ifndef GRADCOMP_CODECS_CUDA_DECODE_H_
#define GRADCOMP_CODECS_CUDA_DECODE_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace gradcomp::codecs::cuda {

// A dense body of n fp32, fp16 or bf16 values (codecs/cpu/half.h AddFloat,
// AddHalf, AddBf16).
cudaError_t LaunchAddFloat(const void* body, size_t n, float alpha, float* acc,
                           cudaStream_t stream);
cudaError_t LaunchAddHalf(const void* body, size_t n, float alpha, float* acc,
                          cudaStream_t stream);
cudaError_t LaunchAddBf16(const void* body, size_t n, float alpha, float* acc,
                          cudaStream_t stream);
// The int8 body: ceil(n / bucket) checked (min, max) pairs, n level bytes.
cudaError_t LaunchInt8DecodeAdd(const void* ranges, const uint8_t* codes,
                                size_t n, size_t bucket, float alpha,
                                float* acc, cudaStream_t stream);
// The qsgd body: ceil(n / bucket) checked norms, ceil(n * bits / 8) bytes of
// packed codes.
cudaError_t LaunchQsgdDecodeAdd(const void* norms, const uint8_t* codes,
                                size_t n, size_t bucket, int bits, float alpha,
                                float* acc, cudaStream_t stream);

// A sparse body (codecs/cpu/topk.cc): acc[indices[j]] += alpha * values[j]
// for j < count; the indices strictly ascending (checked by the caller).
cudaError_t LaunchScatterAdd(const uint32_t* indices, const float* values,
                             size_t count, float alpha, float* acc,
                             cudaStream_t stream);

}  // namespace gradcomp::codecs::cuda

#endif  // GRADCOMP_CODECS_CUDA_DECODE_H_
