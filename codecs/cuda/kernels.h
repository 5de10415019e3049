// Host entry points of the CUDA kernels (half.cu, int8.cu, qsgd.cu). Every
// pointer is device memory; each call launches on `stream` and returns the
// launch's error (cudaSuccess when queued). The bodies they write are the
// CPU codecs' bodies byte for byte (docs/wire-format.md, docs/gpu.md):
// the kernels evaluate the same fp32 expressions in the same order, with no
// fused multiply-adds (built with -fmad=false and _rn intrinsics).
//
//   LaunchFloatToHalf(d_grad, n, 1.0f, d_body, stream);
#ifndef GRADCOMP_CODECS_CUDA_KERNELS_H_
#define GRADCOMP_CODECS_CUDA_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace gradcomp::codecs::cuda {

// The words of a codecs/random.h PhiloxStream (PhiloxStream::GetWords()):
// block b of the stream is Philox4x64-10({b, counter_tail}, key).
struct PhiloxWords {
  uint64_t counter_tail[3];
  uint64_t key[2];
};

// out[i] = 16-bit(in[i] * scale) (codecs/cpu/half.h FloatToHalf / FloatToBf16,
// same rounding and NaN payloads); out holds 2 * n bytes.
cudaError_t LaunchFloatToHalf(const float* in, size_t n, float scale, void* out,
                              cudaStream_t stream);
cudaError_t LaunchFloatToBf16(const float* in, size_t n, float scale, void* out,
                              cudaStream_t stream);
// out[i] = in[i] * scale in fp32; out holds 4 * n bytes. (With scale 1 the
// CPU copies, keeping signalling NaNs as they are: copy instead.)
cudaError_t LaunchScaleFloat(const float* in, size_t n, float scale, void* out,
                             cudaStream_t stream);

// The int8 body (codecs/cpu/int8.h): ceil(n / bucket) (min, max) fp32 pairs
// at `ranges`, then n level bytes at `codes`. `rng` null rounds to nearest.
// Sets *nonfinite (device int, zeroed by the caller) to 1 if a value is
// NaN or Inf. Buckets of 256..2048 values that are a multiple of 256 (the
// default 1024 is) take a one-pass kernel that reads x once; other sizes
// read it twice.
cudaError_t LaunchInt8Encode(const float* x, size_t n, size_t bucket,
                             const PhiloxWords* rng, void* ranges,
                             uint8_t* codes, int* nonfinite,
                             cudaStream_t stream);

// codecs/cpu/kernels.h kTinySumOfSquares (cuda_codec.cc checks they are
// equal): below it the CPU takes a bucket's sum of squares in double.
inline constexpr float kTinySumOfSquares = 0x1p-64f;

// The qsgd body (codecs/cpu/qsgd.h): ceil(n / bucket) fp32 norms at `norms`,
// then ceil(n * bits / 8) bytes of packed codes at `codes`. Sets *nonfinite
// to 1 if a bucket's norm is not finite, or if its fp32 sum of squares is
// below kTinySumOfSquares while a value is not zero (the squares may have
// underflowed; the CPU's BucketNorm sums those in double): the caller then
// encodes on the host. Buckets of 256..2048 values that
// are a multiple of 256 (the default 512 is) take a one-pass kernel; other
// sizes read x twice (norms, then codes).
cudaError_t LaunchQsgdEncode(const float* x, size_t n, size_t bucket, int bits,
                             const PhiloxWords& rng, void* norms,
                             uint8_t* codes, int* nonfinite,
                             cudaStream_t stream);

}  // namespace gradcomp::codecs::cuda

#endif  // GRADCOMP_CODECS_CUDA_KERNELS_H_
