// fp32 -> fp16 / bf16 / scaled fp32 bodies of the dense codecs.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>

#include "codecs/cuda/groups.cuh"
#include "codecs/cuda/kernels.h"

namespace gradcomp::codecs::cuda {
namespace {

// The NaN rules of codecs/cpu/half.cc: fp16 keeps the top ten payload bits
// and sets the quiet bit; bf16 sets the quiet bit and truncates. Finite
// values and infinities round to nearest even, as the hardware does.
__device__ uint16_t HalfBits(float f) {
  const uint32_t x = __float_as_uint(f);
  const uint32_t abs = x & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) {
    return static_cast<uint16_t>(((x >> 16) & 0x8000u) | 0x7E00u |
                                 ((abs >> 13) & 0x3FFu));
  }
  return __half_as_ushort(__float2half_rn(f));
}

__device__ uint16_t Bf16Bits(float f) {
  const uint32_t x = __float_as_uint(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) {
    return static_cast<uint16_t>((x | 0x00400000u) >> 16);
  }
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}

// in * scale as the x86 build computes it: the GPU returns its canonical
// NaN for NaN * scale, x86 returns the NaN operand with the quiet bit set,
// and the payload bits reach the 16-bit result.
__device__ float ScaleLikeX86(float in, float scale) {
  if (isnan(in)) return __uint_as_float(__float_as_uint(in) | 0x00400000u);
  return __fmul_rn(in, scale);
}

// One thread per group of 8 values: two 16-byte loads, one 16-byte store
// where both pointers are 16-byte aligned.
template <uint16_t (*kConvert)(float)>
__global__ void To16Kernel(const float* __restrict__ in, size_t n, float scale,
                           bool aligned, uint16_t* __restrict__ out) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t g = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       g < GroupsOf(n); g += stride) {
    const int count = GroupCount(n, g);
    float v[kGroup];
    LoadGroup(in, kGroup * g, count, aligned, v);
    uint16_t h[kGroup];
    for (int j = 0; j < kGroup; ++j) h[j] = kConvert(ScaleLikeX86(v[j], scale));
    StoreGroup16(out, kGroup * g, count, aligned, h);
  }
}

__global__ void ScaleKernel(const float* __restrict__ in, size_t n, float scale,
                            bool aligned, float* __restrict__ out) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t g = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       g < GroupsOf(n); g += stride) {
    const int count = GroupCount(n, g);
    float v[kGroup];
    LoadGroup(in, kGroup * g, count, aligned, v);
    for (int j = 0; j < kGroup; ++j) v[j] = ScaleLikeX86(v[j], scale);
    StoreGroup(out, kGroup * g, count, aligned, v);
  }
}

}  // namespace

// `out` is usually a cudaMalloc'd body buffer (256-byte aligned); `in` may be
// any caller's tensor, so alignment is checked, not assumed.
cudaError_t LaunchFloatToHalf(const float* in, size_t n, float scale, void* out,
                              cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  To16Kernel<HalfBits><<<GroupBlocks(n), kGroupThreads, 0, stream>>>(
      in, n, scale, Aligned16(in) && Aligned16(out),
      static_cast<uint16_t*>(out));
  return cudaGetLastError();
}

cudaError_t LaunchFloatToBf16(const float* in, size_t n, float scale, void* out,
                              cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  To16Kernel<Bf16Bits><<<GroupBlocks(n), kGroupThreads, 0, stream>>>(
      in, n, scale, Aligned16(in) && Aligned16(out),
      static_cast<uint16_t*>(out));
  return cudaGetLastError();
}

cudaError_t LaunchScaleFloat(const float* in, size_t n, float scale, void* out,
                             cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  ScaleKernel<<<GroupBlocks(n), kGroupThreads, 0, stream>>>(
      in, n, scale, Aligned16(in) && Aligned16(out), static_cast<float*>(out));
  return cudaGetLastError();
}

}  // namespace gradcomp::codecs::cuda
