// Reproducible randomness: a counter-based Philox4x64-10 stream (Random123)
// keyed by (seed, tensor, step, round). The i-th number of a stream is the
// same on every rank and on CPU and GPU, whatever order it is drawn in.
//
//   PhiloxStream rng(ctx.seed, ctx.tensor_id, ctx.step, /*round=*/0);
//   float u = rng.Uniform(i);  // in [0, 1)
#ifndef GRADCOMP_CODECS_RANDOM_H_
#define GRADCOMP_CODECS_RANDOM_H_

#include <cstdint>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace gradcomp::codecs {

// A stable 64-bit id of a tensor name (FNV-1a), identical in every process.
uint64_t TensorId(absl::string_view name);

class PhiloxStream {
 public:
  PhiloxStream(uint64_t seed, uint64_t tensor_id, int64_t step, uint32_t round);

  // Four 64-bit words of block `block` (the counter), a pure function of
  // the key and `block`.
  void Block(uint64_t block, uint64_t out[4]) const;

  // The i-th 32-bit word of the stream (word i of block i / 8).
  uint32_t Bits(uint64_t i) const;

  // The i-th uniform float in [0, 1), from Bits(i) (24 bits of mantissa).
  float Uniform(uint64_t i) const;

  // out[j] = Uniform(first + j), a block at a time (the fast path).
  void FillUniform(uint64_t first, absl::Span<float> out) const;

  // The words that fix the stream, for backends that evaluate Philox
  // themselves (codecs/cuda): Block(b) is Philox4x64-10 of the counter
  // {b, counter_tail[0], counter_tail[1], counter_tail[2]} under `key`.
  struct Words {
    uint64_t counter_tail[3];
    uint64_t key[2];
  };
  Words GetWords() const;

 private:
  uint64_t key_[2];
  uint64_t tensor_id_;
  uint64_t step_;
  uint64_t round_;
};

}  // namespace gradcomp::codecs

#endif  // GRADCOMP_CODECS_RANDOM_H_
