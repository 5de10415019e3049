#include "codecs/random.h"

#include <Random123/philox.h>

#include "base/fnv1a.h"

namespace gradcomp::codecs {
namespace {

// Second key word: "gradcomp" in ASCII, so that our streams differ from any
// other Philox user's with the same seed.
constexpr uint64_t kKeyTag = 0x67726164636f6d70ULL;
constexpr float kTwoPowMinus24 = 1.0f / 16777216.0f;

float ToUniform(uint32_t bits) {
  return static_cast<float>(bits >> 8) * kTwoPowMinus24;
}

}  // namespace

uint64_t TensorId(absl::string_view name) { return Fnv1a64::Of(name); }

PhiloxStream::PhiloxStream(uint64_t seed, uint64_t tensor_id, int64_t step,
                           uint32_t round)
    : key_{seed, kKeyTag},
      tensor_id_(tensor_id),
      step_(static_cast<uint64_t>(step)),
      round_(round) {}

void PhiloxStream::Block(uint64_t block, uint64_t out[4]) const {
  r123::Philox4x64 philox;
  const r123::Philox4x64::ctr_type ctr = {{block, step_, round_, tensor_id_}};
  const r123::Philox4x64::key_type key = {{key_[0], key_[1]}};
  const r123::Philox4x64::ctr_type r = philox(ctr, key);
  for (int i = 0; i < 4; ++i) out[i] = r.v[i];
}

PhiloxStream::Words PhiloxStream::GetWords() const {
  return Words{{step_, round_, tensor_id_}, {key_[0], key_[1]}};
}

uint32_t PhiloxStream::Bits(uint64_t i) const {
  uint64_t words[4];
  Block(i / 8, words);
  const uint64_t word = words[(i % 8) / 2];
  // Even indices take the low half of a 64-bit word, odd ones the high half.
  return static_cast<uint32_t>((i % 2 == 0) ? word : word >> 32);
}

float PhiloxStream::Uniform(uint64_t i) const { return ToUniform(Bits(i)); }

void PhiloxStream::FillUniform(uint64_t first, absl::Span<float> out) const {
  size_t j = 0;
  uint64_t i = first;
  uint64_t words[4];
  // Leading partial block, then whole blocks of 8, then the tail.
  while (j < out.size() && i % 8 != 0) out[j++] = Uniform(i++);
  for (; j + 8 <= out.size(); j += 8, i += 8) {
    Block(i / 8, words);
    for (int w = 0; w < 4; ++w) {
      out[j + 2 * w] = ToUniform(static_cast<uint32_t>(words[w]));
      out[j + 2 * w + 1] = ToUniform(static_cast<uint32_t>(words[w] >> 32));
    }
  }
  while (j < out.size()) out[j++] = Uniform(i++);
}

}  // namespace gradcomp::codecs
