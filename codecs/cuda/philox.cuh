// The codecs/random.h Philox stream evaluated on the device: word i of the
// stream is the same 32 bits as PhiloxStream::Bits(i) on the host, and
// ToUniform the same float as PhiloxStream::Uniform.
#ifndef GRADCOMP_CODECS_CUDA_PHILOX_CUH_
#define GRADCOMP_CODECS_CUDA_PHILOX_CUH_

#include <Random123/philox.h>

#include <cstdint>

#include "codecs/cuda/kernels.h"

namespace gradcomp::codecs::cuda {

// The four 64-bit words of block `block` (PhiloxStream::Block).
__device__ inline void PhiloxBlock64(const PhiloxWords& rng, uint64_t block,
                                     uint64_t out[4]) {
  r123::Philox4x64 philox;
  const r123::Philox4x64::ctr_type ctr = {
      {block, rng.counter_tail[0], rng.counter_tail[1], rng.counter_tail[2]}};
  const r123::Philox4x64::key_type key = {{rng.key[0], rng.key[1]}};
  const r123::Philox4x64::ctr_type r = philox(ctr, key);
  for (int w = 0; w < 4; ++w) out[w] = r.v[w];
}

// The eight 32-bit words of block `block`: word 2w is the low half of the
// 64-bit output w, word 2w + 1 its high half.
__device__ inline void PhiloxBlock(const PhiloxWords& rng, uint64_t block,
                                   uint32_t out[8]) {
  uint64_t words[4];
  PhiloxBlock64(rng, block, words);
  for (int w = 0; w < 4; ++w) {
    out[2 * w] = static_cast<uint32_t>(words[w]);
    out[2 * w + 1] = static_cast<uint32_t>(words[w] >> 32);
  }
}

// 24 bits of mantissa, exactly as codecs/random.cc.
__device__ inline float ToUniform(uint32_t bits) {
  return __fmul_rn(static_cast<float>(bits >> 8), 1.0f / 16777216.0f);
}

}  // namespace gradcomp::codecs::cuda

#endif  // GRADCOMP_CODECS_CUDA_PHILOX_CUH_
