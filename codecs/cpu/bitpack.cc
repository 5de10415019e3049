#include "codecs/cpu/bitpack.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "codecs/cpu/parallel.h"

namespace gradcomp::codecs {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "words are written with host-order memcpy");

constexpr size_t kWordBits = 64;
constexpr size_t kLanes = 8;
// Values per partial sum of |x|: the unit of the fixed summation order and
// of the parallel split.
constexpr size_t kSumChunk = size_t{1} << 16;
// Values unpacked to bytes at a time when decoding (a multiple of 64).
constexpr size_t kUnpackChunk = 2048;

// Gathers bit 0 of each of the 8 bytes of `bytes` into one byte, byte k to
// bit k: multiplying by sum_k 2^(56 - 7k) moves byte k's bit to bit 56 + k,
// and no two partial products overlap, so nothing carries.
inline uint64_t GatherBytes(uint64_t bytes) {
  return (bytes * 0x0102040810204080ull) >> 56;
}

// Packs the signs of x[0, 64) into one word and adds |x| into the lanes.
inline uint64_t PackBlock(const float* x, float lanes[kLanes]) {
  uint8_t neg[kWordBits];
  for (size_t j = 0; j < kWordBits; ++j) neg[j] = x[j] < 0.0f;
  for (size_t j = 0; j < kWordBits; j += kLanes) {
    for (size_t l = 0; l < kLanes; ++l) lanes[l] += std::fabs(x[j + l]);
  }
  uint64_t word = 0;
  for (size_t k = 0; k < 8; ++k) {
    uint64_t bytes;
    std::memcpy(&bytes, neg + 8 * k, sizeof(bytes));
    word |= GatherBytes(bytes) << (8 * k);
  }
  return word;
}

// Packs x[begin, end) (begin a multiple of 64) and returns sum |x| over it.
double PackRange(const float* x, size_t begin, size_t end, char* out) {
  double total = 0;
  size_t i = begin;
  for (; i + kWordBits <= end; i += kWordBits) {
    float lanes[kLanes] = {};
    const uint64_t word = PackBlock(x + i, lanes);
    std::memcpy(out + i / 8, &word, sizeof(word));
    for (size_t l = 0; l < kLanes; ++l) total += lanes[l];
  }
  if (i < end) {
    // The tail, zero-padded: zeros add nothing and pack as 0 bits.
    float padded[kWordBits] = {};
    std::copy(x + i, x + end, padded);
    float lanes[kLanes] = {};
    const uint64_t word = PackBlock(padded, lanes);
    std::memcpy(out + i / 8, &word, sizeof(word));
    for (size_t l = 0; l < kLanes; ++l) total += lanes[l];
  }
  return total;
}

// kSpread[b] has byte k equal to bit k of b.
struct SpreadTable {
  uint64_t entry[256];
  constexpr SpreadTable() : entry() {
    for (int b = 0; b < 256; ++b) {
      uint64_t v = 0;
      for (int k = 0; k < 8; ++k) v |= uint64_t((b >> k) & 1) << (8 * k);
      entry[b] = v;
    }
  }
};
constexpr SpreadTable kSpread;

}  // namespace

double PackSigns(absl::Span<const float> x, char* out) {
  const size_t n = x.size();
  std::vector<double> partial((n + kSumChunk - 1) / kSumChunk, 0.0);
  ParallelFor(n, ParallelOptions{/*min_per_part=*/size_t{1} << 20, kSumChunk},
              [&](size_t begin, size_t end, int) {
                for (size_t c = begin; c < end; c += kSumChunk) {
                  partial[c / kSumChunk] = PackRange(
                      x.data(), c, std::min(c + kSumChunk, end), out);
                }
              });
  double total = 0;
  for (double p : partial) total += p;
  return total;
}

void UnpackSigns(const char* in, size_t begin, size_t count, uint8_t* out) {
  const char* word = in + begin / 8;
  size_t i = 0;
  for (; i + kWordBits <= count; i += kWordBits, word += 8) {
    for (size_t k = 0; k < 8; ++k) {
      std::memcpy(out + i + 8 * k,
                  &kSpread.entry[static_cast<uint8_t>(word[k])], 8);
    }
  }
  for (size_t k = 0; i < count; ++k) {
    uint8_t spread[8];
    std::memcpy(spread, &kSpread.entry[static_cast<uint8_t>(word[k])], 8);
    for (size_t j = 0; j < 8 && i < count; ++j, ++i) out[i] = spread[j];
  }
}

void AddSigns(const char* in, float pos, float neg, absl::Span<float> acc) {
  ParallelFor(
      acc.size(), ParallelOptions{/*min_per_part=*/size_t{1} << 20, kWordBits},
      [&](size_t begin, size_t end, int) {
        uint8_t bits[kUnpackChunk];
        for (size_t c = begin; c < end; c += kUnpackChunk) {
          const size_t count = std::min(kUnpackChunk, end - c);
          UnpackSigns(in, c, count, bits);
          float* a = acc.data() + c;
          for (size_t t = 0; t < count; ++t) a[t] += bits[t] ? neg : pos;
        }
      });
}

bool SignPaddingIsZero(const char* in, size_t n) {
  const size_t used = n % kWordBits;
  if (used == 0) return true;
  uint64_t last;
  std::memcpy(&last, in + SignBytes(n) - 8, sizeof(last));
  return (last >> used) == 0;
}

}  // namespace gradcomp::codecs
