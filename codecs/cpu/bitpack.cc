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

// kBit.v[t] = 1 << t: a constant vector the compiler can AND with, where a
// shift by the loop index would not vectorise.
struct BitTable {
  uint32_t v[32];
  constexpr BitTable() : v() {
    for (int t = 0; t < 32; ++t) v[t] = uint32_t{1} << t;
  }
};
constexpr BitTable kBit;

// a[t] += (bit t of word) ? q[t] : p[t] for t < 64. Both values are loaded
// unconditionally and the condition is a 32-bit lane mask, so that the loop
// becomes vector compares and blends.
inline void AddWord(uint64_t word, const float* p, const float* q, float* a) {
  for (size_t half = 0; half < 2; ++half) {
    const uint32_t bits = static_cast<uint32_t>(word >> (32 * half));
    const size_t o = 32 * half;
    for (size_t t = 0; t < 32; ++t) {
      const float pv = p[o + t];
      const float qv = q[o + t];
      a[o + t] += (bits & kBit.v[t]) ? qv : pv;
    }
  }
}

}  // namespace

double PackSigns(absl::Span<const float> x, char* out) {
  const size_t n = x.size();
  std::vector<double> partial((n + kSumChunk - 1) / kSumChunk, 0.0);
  ParallelFor(n, ParallelOptions{/*min_per_part=*/size_t{1} << 20, kSumChunk},
              [&](size_t begin, size_t end, int) {
                for (size_t c = begin; c < end; c += kSumChunk) {
                  partial[c / kSumChunk] =
                      PackRange(x.data(), c, std::min(c + kSumChunk, end), out);
                }
              });
  double total = 0;
  for (double p : partial) total += p;
  // Not finite: x holds NaN or Inf (the double sum is then too), or a lane
  // overflowed on finite values.
  if (!std::isfinite(total)) {
    total = 0;
    for (float v : x) total += std::fabs(static_cast<double>(v));
  }
  return total;
}

void AddSigns(const char* in, float pos, float neg, absl::Span<float> acc) {
  float p[1 + kWordBits], q[1 + kWordBits];
  std::fill(p, p + 1 + kWordBits, pos);
  std::fill(q, q + 1 + kWordBits, neg);
  AddSignsPeriodic(in, p, q, acc);
}

void AddSignsPeriodic(const char* in, absl::Span<const float> pos,
                      absl::Span<const float> neg, absl::Span<float> acc) {
  const size_t period = pos.size() - kWordBits;
  ParallelFor(acc.size(),
              ParallelOptions{/*min_per_part=*/size_t{1} << 20, kWordBits},
              [&](size_t begin, size_t end, int) {
                size_t lane = begin % period;
                for (size_t i = begin; i < end; i += kWordBits) {
                  uint64_t word;
                  std::memcpy(&word, in + i / 8, sizeof(word));
                  const float* p = pos.data() + lane;
                  const float* q = neg.data() + lane;
                  float* a = acc.data() + i;
                  if (i + kWordBits <= end) {
                    AddWord(word, p, q, a);
                  } else {
                    for (size_t t = 0; t < end - i; ++t) {
                      a[t] += ((word >> t) & 1) ? q[t] : p[t];
                    }
                  }
                  lane = (lane + kWordBits) % period;
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
