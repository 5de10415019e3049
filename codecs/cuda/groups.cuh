// Groups of eight consecutive values: the unit of work of every kernel in
// half.cu, int8.cu, qsgd.cu and decode.cu. Eight values share one Philox
// block (philox.cuh), fill 32 bytes of fp32 (two 16-byte accesses), 16 bytes
// of fp16, 8 int8 codes or `bits` bytes of packed QSGD codes, so a thread per
// group moves memory in wide, coalesced accesses.
//
//   float v[8];
//   LoadGroup(x, 8 * g, GroupCount(n, g), Aligned16(x), v);
#ifndef GRADCOMP_CODECS_CUDA_GROUPS_CUH_
#define GRADCOMP_CODECS_CUDA_GROUPS_CUH_

#include <cstddef>
#include <cstdint>

namespace gradcomp::codecs::cuda {

constexpr int kGroup = 8;

// Threads per block of the group kernels.
constexpr int kGroupThreads = 256;

inline bool Aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

__host__ __device__ inline size_t GroupsOf(size_t n) {
  return (n + kGroup - 1) / kGroup;
}

// Blocks for one thread per group, capped: the kernels loop over the groups
// with a grid stride beyond the cap.
inline unsigned GroupBlocks(size_t n) {
  const size_t blocks = (GroupsOf(n) + kGroupThreads - 1) / kGroupThreads;
  return static_cast<unsigned>(blocks < (1u << 20) ? (blocks > 0 ? blocks : 1)
                                                   : (1u << 20));
}

// Values of group g in a tensor of n: 8 except in a last, partial group.
__device__ inline int GroupCount(size_t n, size_t g) {
  const size_t left = n - kGroup * g;
  return left < kGroup ? static_cast<int>(left) : kGroup;
}

// x[i0, i0 + count) into v, zeros after count. `aligned`: x is 16-byte
// aligned (i0 is a multiple of 8, so x + i0 is then too).
__device__ inline void LoadGroup(const float* __restrict__ x, size_t i0,
                                 int count, bool aligned, float v[kGroup]) {
  if (aligned && count == kGroup) {
    const float4 a = reinterpret_cast<const float4*>(x + i0)[0];
    const float4 b = reinterpret_cast<const float4*>(x + i0)[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
    v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    return;
  }
  for (int j = 0; j < kGroup; ++j) v[j] = j < count ? x[i0 + j] : 0.0f;
}

__device__ inline void StoreGroup(float* __restrict__ x, size_t i0, int count,
                                  bool aligned, const float v[kGroup]) {
  if (aligned && count == kGroup) {
    reinterpret_cast<float4*>(x + i0)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(x + i0)[1] = make_float4(v[4], v[5], v[6], v[7]);
    return;
  }
  for (int j = 0; j < kGroup; ++j) {
    if (j < count) x[i0 + j] = v[j];
  }
}

// 16-bit values h[i0, i0 + count) into v; `aligned` as for LoadGroup.
__device__ inline void LoadGroup16(const uint16_t* __restrict__ h, size_t i0,
                                   int count, bool aligned,
                                   uint16_t v[kGroup]) {
  if (aligned && count == kGroup) {
    const uint4 w = *reinterpret_cast<const uint4*>(h + i0);
    const uint32_t words[4] = {w.x, w.y, w.z, w.w};
    for (int k = 0; k < 4; ++k) {
      v[2 * k] = static_cast<uint16_t>(words[k]);
      v[2 * k + 1] = static_cast<uint16_t>(words[k] >> 16);
    }
    return;
  }
  for (int j = 0; j < kGroup; ++j) v[j] = j < count ? h[i0 + j] : 0;
}

__device__ inline void StoreGroup16(uint16_t* __restrict__ h, size_t i0,
                                    int count, bool aligned,
                                    const uint16_t v[kGroup]) {
  if (aligned && count == kGroup) {
    uint32_t words[4];
    for (int k = 0; k < 4; ++k) {
      words[k] = v[2 * k] | static_cast<uint32_t>(v[2 * k + 1]) << 16;
    }
    *reinterpret_cast<uint4*>(h + i0) =
        make_uint4(words[0], words[1], words[2], words[3]);
    return;
  }
  for (int j = 0; j < kGroup; ++j) {
    if (j < count) h[i0 + j] = v[j];
  }
}

// The low `bytes` (at most 8) bytes of `word`, little-endian, at out: in
// one or two aligned stores where out allows (code bodies follow a table
// of 4- or 8-byte entries, so they are often only 4-byte aligned).
__device__ inline void StoreBytes(uint8_t* __restrict__ out, uint64_t word,
                                  int bytes) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(out);
  if (bytes == 8 && at % 8 == 0) {
    *reinterpret_cast<uint64_t*>(out) = word;
  } else if (bytes == 8 && at % 4 == 0) {
    reinterpret_cast<uint32_t*>(out)[0] = static_cast<uint32_t>(word);
    reinterpret_cast<uint32_t*>(out)[1] = static_cast<uint32_t>(word >> 32);
  } else if (bytes == 4 && at % 4 == 0) {
    *reinterpret_cast<uint32_t*>(out) = static_cast<uint32_t>(word);
  } else if (bytes == 2 && at % 2 == 0) {
    *reinterpret_cast<uint16_t*>(out) = static_cast<uint16_t>(word);
  } else {
    for (int k = 0; k < bytes; ++k)
      out[k] = static_cast<uint8_t>(word >> (8 * k));
  }
}

// The inverse of StoreBytes: `bytes` (at most 8) bytes at in, little-endian.
__device__ inline uint64_t LoadBytes(const uint8_t* __restrict__ in,
                                     int bytes) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(in);
  if (bytes == 8 && at % 8 == 0) return *reinterpret_cast<const uint64_t*>(in);
  if (bytes == 8 && at % 4 == 0) {
    const uint32_t* w = reinterpret_cast<const uint32_t*>(in);
    return w[0] | static_cast<uint64_t>(w[1]) << 32;
  }
  if (bytes == 4 && at % 4 == 0) return *reinterpret_cast<const uint32_t*>(in);
  if (bytes == 2 && at % 2 == 0) return *reinterpret_cast<const uint16_t*>(in);
  uint64_t word = 0;
  for (int k = 0; k < bytes; ++k)
    word |= static_cast<uint64_t>(in[k]) << (8 * k);
  return word;
}

}  // namespace gradcomp::codecs::cuda

#endif  // GRADCOMP_CODECS_CUDA_GROUPS_CUH_
