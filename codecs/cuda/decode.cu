// The decoders: acc += alpha * decode(body) into device memory, as the CPU
// decoders compute it (codecs/cpu/half.cc AddHalf/AddBf16/AddFloat,
// codecs/cpu/int8.cc and codecs/cpu/qsgd.cc DecodeAdd): the same fp32
// operations in the same order, each rounded on its own.
#include <cfloat>
#include <cstddef>
#include <cstdint>

#include "codecs/cuda/decode.h"

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

template <typename T, float (*kToFloat)(T)>
__global__ void AddDenseKernel(const T* __restrict__ body, size_t n,
                               float alpha, float* __restrict__ acc) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < n; i += stride) {
    acc[i] = __fadd_rn(acc[i], __fmul_rn(alpha, kToFloat(body[i])));
  }
}

__device__ float Identity(float f) { return f; }

// codecs/cpu/int8.cc DecodeAdd: with step = fp32((max - min) / 255) in
// double and unit 1 (2 when max - min overflows fp32),
// acc += ((alpha * min) / unit + q * ((alpha * step) / unit)) * unit.
__global__ void Int8DecodeKernel(const float* __restrict__ ranges,
                                 const uint8_t* __restrict__ codes, size_t n,
                                 size_t bucket, float alpha,
                                 float* __restrict__ acc) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < n; i += stride) {
    const size_t b = i / bucket;
    const float lo = ranges[2 * b];
    const float hi = ranges[2 * b + 1];
    const double range = static_cast<double>(hi) - static_cast<double>(lo);
    const float step = __double2float_rn(__ddiv_rn(range, 255.0));
    const float unit = range > static_cast<double>(FLT_MAX) ? 2.0f : 1.0f;
    const float base = __fdiv_rn(__fmul_rn(alpha, lo), unit);
    const float scaled_step = __fdiv_rn(__fmul_rn(alpha, step), unit);
    const float value = __fmul_rn(
        __fadd_rn(base, __fmul_rn(static_cast<float>(codes[i]), scaled_step)),
        unit);
    acc[i] = __fadd_rn(acc[i], value);
  }
}

// codecs/cpu/qsgd.cc DecodeRange: code i sits at bit i * bits of the packed
// stream (low bits first); acc += +-(level * ((alpha * norm) / levels)).
__global__ void QsgdDecodeKernel(const float* __restrict__ norms,
                                 const uint8_t* __restrict__ codes, size_t n,
                                 size_t bucket, int bits, float alpha,
                                 float* __restrict__ acc) {
  const uint32_t sign = 1u << (bits - 1);
  const uint32_t level_mask = sign - 1;
  const float levels = static_cast<float>(level_mask);
  const size_t code_bytes = (n * bits + 7) / 8;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < n; i += stride) {
    const size_t bit = i * bits;
    const size_t byte = bit / 8;
    uint32_t window = codes[byte];
    if (byte + 1 < code_bytes)
      window |= static_cast<uint32_t>(codes[byte + 1]) << 8;
    const uint32_t code = (window >> (bit % 8)) & ((1u << bits) - 1);
    const float scale = __fdiv_rn(__fmul_rn(alpha, norms[i / bucket]), levels);
    const float value = __fmul_rn(static_cast<float>(code & level_mask), scale);
    acc[i] = __fadd_rn(acc[i], (code & sign) != 0 ? -value : value);
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
  AddDenseKernel<float, Identity><<<BlocksFor(n), kThreads, 0, stream>>>(
      static_cast<const float*>(body), n, alpha, acc);
  return cudaGetLastError();
}

cudaError_t LaunchAddHalf(const void* body, size_t n, float alpha, float* acc,
                          cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  AddDenseKernel<uint16_t, HalfToFloat><<<BlocksFor(n), kThreads, 0, stream>>>(
      static_cast<const uint16_t*>(body), n, alpha, acc);
  return cudaGetLastError();
}

cudaError_t LaunchAddBf16(const void* body, size_t n, float alpha, float* acc,
                          cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  AddDenseKernel<uint16_t, Bf16ToFloat><<<BlocksFor(n), kThreads, 0, stream>>>(
      static_cast<const uint16_t*>(body), n, alpha, acc);
  return cudaGetLastError();
}

cudaError_t LaunchInt8DecodeAdd(const void* ranges, const uint8_t* codes,
                                size_t n, size_t bucket, float alpha,
                                float* acc, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  Int8DecodeKernel<<<BlocksFor(n), kThreads, 0, stream>>>(
      static_cast<const float*>(ranges), codes, n, bucket, alpha, acc);
  return cudaGetLastError();
}

cudaError_t LaunchQsgdDecodeAdd(const void* norms, const uint8_t* codes,
                                size_t n, size_t bucket, int bits, float alpha,
                                float* acc, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  QsgdDecodeKernel<<<BlocksFor(n), kThreads, 0, stream>>>(
      static_cast<const float*>(norms), codes, n, bucket, bits, alpha, acc);
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
