// The decoders: acc += alpha * decode(body) into device memory, as the CPU
// decoders compute it (codecs/cpu/half.cc AddHalf/AddBf16/AddFloat,
// codecs/cpu/int8.cc and codecs/cpu/qsgd.cc DecodeAdd): the same fp32
// operations in the same order, each rounded on its own.
#include <cfloat>
#include <cstddef>
#include <cstdint>

#include "codecs/cuda/decode.h"
#include "codecs/cuda/groups.cuh"

namespace gradcomp::codecs::cuda {
namespace {

constexpr int kThreads = 256;

// codecs/cpu/half.cc HalfBitsToFloat, bit for bit (NaNs made quiet).
__device__ float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu;
  const uint32_t mantissa = h & 0x3FFu;
  if (exponent == 0x1F) {
    const uint32_t quiet = mantissa != 0 ? 0x00400000u : 0u;
    return __uint_as_float(sign | 0x7F800000u | quiet | (mantissa << 13));
  }
  if (exponent == 0) {  // mantissa * 2^-24: exact in fp32
    const float magnitude =
        __fmul_rn(static_cast<float>(mantissa), 5.9604644775390625e-8f);
    return sign != 0 ? -magnitude : magnitude;
  }
  return __uint_as_float(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

__device__ float Bf16ToFloat(uint16_t b) {
  return __uint_as_float(static_cast<uint32_t>(b) << 16);
}

// acc[i] += alpha * body[i] for a dense fp32 body (two 16-byte loads per
// group of 8) or a 16-bit one (one 16-byte load per group).
__global__ void AddFloatKernel(const float* __restrict__ body, size_t n,
                               float alpha, bool aligned,
                               float* __restrict__ acc) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t g = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       g < GroupsOf(n); g += stride) {
    const int count = GroupCount(n, g);
    float v[kGroup];
    float a[kGroup];
    LoadGroup(body, kGroup * g, count, aligned, v);
    LoadGroup(acc, kGroup * g, count, aligned, a);
    for (int j = 0; j < kGroup; ++j)
      a[j] = __fadd_rn(a[j], __fmul_rn(alpha, v[j]));
    StoreGroup(acc, kGroup * g, count, aligned, a);
  }
}

template <float (*kToFloat)(uint16_t)>
__global__ void Add16Kernel(const uint16_t* __restrict__ body, size_t n,
                            float alpha, bool aligned,
                            float* __restrict__ acc) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t g = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       g < GroupsOf(n); g += stride) {
    const int count = GroupCount(n, g);
    uint16_t h[kGroup];
    float a[kGroup];
    LoadGroup16(body, kGroup * g, count, aligned, h);
    LoadGroup(acc, kGroup * g, count, aligned, a);
    for (int j = 0; j < kGroup; ++j) {
      a[j] = __fadd_rn(a[j], __fmul_rn(alpha, kToFloat(h[j])));
    }
    StoreGroup(acc, kGroup * g, count, aligned, a);
  }
}

// codecs/cpu/int8.cc DecodeAdd: with step = fp32((max - min) / 255) in
// double and unit 1 (2 when max - min overflows fp32),
// acc += ((alpha * min) / unit + q * ((alpha * step) / unit)) * unit.
struct Int8Terms {
  float base;         // (alpha * min) / unit
  float scaled_step;  // (alpha * step) / unit
  float unit;
};

__device__ Int8Terms Int8TermsOf(const float* __restrict__ ranges, size_t b,
                                 float alpha) {
  const float lo = ranges[2 * b];
  const float hi = ranges[2 * b + 1];
  const double range = static_cast<double>(hi) - static_cast<double>(lo);
  const float step = __double2float_rn(__ddiv_rn(range, 255.0));
  const float unit = range > static_cast<double>(FLT_MAX) ? 2.0f : 1.0f;
  return Int8Terms{__fdiv_rn(__fmul_rn(alpha, lo), unit),
                   __fdiv_rn(__fmul_rn(alpha, step), unit), unit};
}

// One thread per group of 8 codes (one 8-byte load); a group's bucket terms
// are worked out once, again only where a bucket boundary cuts the group.
__global__ void Int8DecodeKernel(const float* __restrict__ ranges,
                                 const uint8_t* __restrict__ codes, size_t n,
                                 size_t bucket, float alpha, bool aligned,
                                 float* __restrict__ acc) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t g = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       g < GroupsOf(n); g += stride) {
    const size_t i0 = kGroup * g;
    const int count = GroupCount(n, g);
    const uint64_t q = LoadBytes(codes + i0, count);
    float a[kGroup];
    LoadGroup(acc, i0, count, aligned, a);
    size_t b = i0 / bucket;
    size_t next_bucket = (b + 1) * bucket;
    Int8Terms t = Int8TermsOf(ranges, b, alpha);
#pragma unroll
    for (int j = 0; j < kGroup; ++j) {
      if (j == count) break;  // a last, partial group
      if (i0 + j == next_bucket) {
        t = Int8TermsOf(ranges, ++b, alpha);
        next_bucket += bucket;
      }
      const float level = static_cast<float>((q >> (8 * j)) & 0xFFu);
      const float value =
          __fmul_rn(__fadd_rn(t.base, __fmul_rn(level, t.scaled_step)), t.unit);
      a[j] = __fadd_rn(a[j], value);
    }
    StoreGroup(acc, i0, count, aligned, a);
  }
}

// codecs/cpu/qsgd.cc DecodeRange: code i sits at bit i * bits of the packed
// stream (low bits first), so group g's 8 codes are the `bits` bytes from
// g * bits; acc += +-(level * ((alpha * norm) / levels)), the scale worked
// out once per group and bucket.
__global__ void QsgdDecodeKernel(const float* __restrict__ norms,
                                 const uint8_t* __restrict__ codes, size_t n,
                                 size_t bucket, int bits, float alpha,
                                 bool aligned, float* __restrict__ acc) {
  const uint32_t sign = 1u << (bits - 1);
  const uint32_t level_mask = sign - 1;
  const uint64_t code_mask = (1u << bits) - 1;
  const float levels = static_cast<float>(level_mask);
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t g = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       g < GroupsOf(n); g += stride) {
    const size_t i0 = kGroup * g;
    const int count = GroupCount(n, g);
    const uint64_t packed = LoadBytes(codes + g * bits, (count * bits + 7) / 8);
    float a[kGroup];
    LoadGroup(acc, i0, count, aligned, a);
    size_t b = i0 / bucket;
    size_t next_bucket = (b + 1) * bucket;
    float scale = __fdiv_rn(__fmul_rn(alpha, norms[b]), levels);
#pragma unroll
    for (int j = 0; j < kGroup; ++j) {
      if (j == count) break;  // a last, partial group
      if (i0 + j == next_bucket) {
        scale = __fdiv_rn(__fmul_rn(alpha, norms[++b]), levels);
        next_bucket += bucket;
      }
      const uint32_t code =
          static_cast<uint32_t>((packed >> (bits * j)) & code_mask);
      const float value =
          __fmul_rn(static_cast<float>(code & level_mask), scale);
      a[j] = __fadd_rn(a[j], (code & sign) != 0 ? -value : value);
    }
    StoreGroup(acc, i0, count, aligned, a);
  }
}

// codecs/cpu/topk.cc DecodeAdd: acc[indices[j]] += alpha * values[j]. The
// indices are distinct (strictly ascending), so no two threads share one.
__global__ void ScatterAddKernel(const uint32_t* __restrict__ indices,
                                 const float* __restrict__ values, size_t count,
                                 float alpha, float* __restrict__ acc) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t j = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       j < count; j += stride) {
    const uint32_t i = indices[j];
    acc[i] = __fadd_rn(acc[i], __fmul_rn(alpha, values[j]));
  }
}

unsigned BlocksFor(size_t n) {
  const size_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65536 ? (blocks > 0 ? blocks : 1)
                                              : 65536);
}

}  // namespace

cudaError_t LaunchAddFloat(const void* body, size_t n, float alpha, float* acc,
                           cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  AddFloatKernel<<<GroupBlocks(n), kGroupThreads, 0, stream>>>(
      static_cast<const float*>(body), n, alpha,
      Aligned16(body) && Aligned16(acc), acc);
  return cudaGetLastError();
}

cudaError_t LaunchAddHalf(const void* body, size_t n, float alpha, float* acc,
                          cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  Add16Kernel<HalfToFloat><<<GroupBlocks(n), kGroupThreads, 0, stream>>>(
      static_cast<const uint16_t*>(body), n, alpha,
      Aligned16(body) && Aligned16(acc), acc);
  return cudaGetLastError();
}

cudaError_t LaunchAddBf16(const void* body, size_t n, float alpha, float* acc,
                          cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  Add16Kernel<Bf16ToFloat><<<GroupBlocks(n), kGroupThreads, 0, stream>>>(
      static_cast<const uint16_t*>(body), n, alpha,
      Aligned16(body) && Aligned16(acc), acc);
  return cudaGetLastError();
}

cudaError_t LaunchInt8DecodeAdd(const void* ranges, const uint8_t* codes,
                                size_t n, size_t bucket, float alpha,
                                float* acc, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  Int8DecodeKernel<<<GroupBlocks(n), kGroupThreads, 0, stream>>>(
      static_cast<const float*>(ranges), codes, n, bucket, alpha,
      Aligned16(acc), acc);
  return cudaGetLastError();
}

cudaError_t LaunchQsgdDecodeAdd(const void* norms, const uint8_t* codes,
                                size_t n, size_t bucket, int bits, float alpha,
                                float* acc, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  QsgdDecodeKernel<<<GroupBlocks(n), kGroupThreads, 0, stream>>>(
      static_cast<const float*>(norms), codes, n, bucket, bits, alpha,
      Aligned16(acc), acc);
  return cudaGetLastError();
}

cudaError_t LaunchScatterAdd(const uint32_t* indices, const float* values,
                             size_t count, float alpha, float* acc,
                             cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  ScatterAddKernel<<<BlocksFor(count), kThreads, 0, stream>>>(
      indices, values, count, alpha, acc);
  return cudaGetLastError();
}

}  // namespace gradcomp::codecs::cuda
