#include "base/crc32c.h"

#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <nmmintrin.h>
#define GRADCOMP_CRC32C_X86 1
#endif

// The table path reads eight bytes as one little-endian word.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "crc32c.cc: add a big-endian load for this host");

namespace gradcomp {
namespace {

constexpr uint32_t kPoly = 0x82f63b78;  // reflected Castagnoli polynomial

uint64_t Load64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// Slicing-by-8 tables: table[k][b] is the CRC of byte b followed by k zeros.
struct Tables {
  uint32_t t[8][256];
  Tables() {
    for (uint32_t b = 0; b < 256; ++b) {
      uint32_t crc = b;
      for (int i = 0; i < 8; ++i) crc = (crc >> 1) ^ (kPoly & (0u - (crc & 1)));
      t[0][b] = crc;
    }
    for (uint32_t b = 0; b < 256; ++b) {
      for (int k = 1; k < 8; ++k)
        t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xff];
    }
  }
};

const Tables& GetTables() {
  static const Tables* const tables = new Tables();
  return *tables;
}

#if GRADCOMP_CRC32C_X86
// The hardware path runs three independent crc32 streams over three
// adjacent blocks (the instruction's latency is 3 cycles, its throughput 1)
// and joins them by shifting a CRC over a block of zeros, with operator
// tables built once (after Mark Adler's crc32c.c).
constexpr size_t kLong = 8192;
constexpr size_t kShort = 256;

// GF(2) 32x32 matrices applied to a CRC: mat[i] is the image of bit i.
uint32_t MatrixTimes(const uint32_t* mat, uint32_t vec) {
  uint32_t sum = 0;
  for (; vec != 0; vec >>= 1, ++mat) {
    if (vec & 1) sum ^= *mat;
  }
  return sum;
}

void MatrixSquare(uint32_t* square, const uint32_t* mat) {
  for (int n = 0; n < 32; ++n) square[n] = MatrixTimes(mat, mat[n]);
}

// The operator that appends `len` zero bytes (a power of two) to a CRC.
void ZerosOperator(uint32_t* even, size_t len) {
  uint32_t odd[32];
  odd[0] = kPoly;  // one zero bit
  uint32_t row = 1;
  for (int n = 1; n < 32; ++n) {
    odd[n] = row;
    row <<= 1;
  }
  MatrixSquare(even, odd);  // two zero bits
  MatrixSquare(odd, even);  // four
  // Each pass squares twice: one byte, two, four, ... until len is reached.
  while (true) {
    MatrixSquare(even, odd);
    len >>= 1;
    if (len == 0) return;
    MatrixSquare(odd, even);
    len >>= 1;
    if (len == 0) break;
  }
  std::memcpy(even, odd, sizeof(odd));
}

struct ShiftTable {
  uint32_t t[4][256];
  explicit ShiftTable(size_t len) {
    uint32_t op[32];
    ZerosOperator(op, len);
    for (uint32_t n = 0; n < 256; ++n) {
      t[0][n] = MatrixTimes(op, n);
      t[1][n] = MatrixTimes(op, n << 8);
      t[2][n] = MatrixTimes(op, n << 16);
      t[3][n] = MatrixTimes(op, n << 24);
    }
  }
  uint32_t Shift(uint32_t crc) const {
    return t[0][crc & 0xff] ^ t[1][(crc >> 8) & 0xff] ^
           t[2][(crc >> 16) & 0xff] ^ t[3][crc >> 24];
  }
};

__attribute__((target("sse4.2"))) uint64_t Blocks3(uint64_t crc0,
                                                   const unsigned char* p,
                                                   size_t block,
                                                   const ShiftTable& shift) {
  uint64_t crc1 = 0, crc2 = 0;
  const unsigned char* end = p + block;
  do {
    crc0 = _mm_crc32_u64(crc0, Load64(p));
    crc1 = _mm_crc32_u64(crc1, Load64(p + block));
    crc2 = _mm_crc32_u64(crc2, Load64(p + 2 * block));
    p += 8;
  } while (p < end);
  crc0 = shift.Shift(static_cast<uint32_t>(crc0)) ^ crc1;
  return shift.Shift(static_cast<uint32_t>(crc0)) ^ crc2;
}

__attribute__((target("sse4.2"))) uint32_t Hardware(uint32_t crc,
                                                    const void* data,
                                                    size_t n) {
  static const ShiftTable* const long_shift = new ShiftTable(kLong);
  static const ShiftTable* const short_shift = new ShiftTable(kShort);
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t c = crc ^ 0xffffffffu;
  for (; n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0; --n, ++p) {
    c = _mm_crc32_u8(static_cast<uint32_t>(c), *p);
  }
  for (; n >= 3 * kLong; n -= 3 * kLong, p += 3 * kLong) {
    c = Blocks3(c, p, kLong, *long_shift);
  }
  for (; n >= 3 * kShort; n -= 3 * kShort, p += 3 * kShort) {
    c = Blocks3(c, p, kShort, *short_shift);
  }
  for (; n >= 8; n -= 8, p += 8) c = _mm_crc32_u64(c, Load64(p));
  for (; n > 0; --n, ++p) c = _mm_crc32_u8(static_cast<uint32_t>(c), *p);
  return static_cast<uint32_t>(c) ^ 0xffffffffu;
}

bool DetectHardware() { return __builtin_cpu_supports("sse4.2"); }
#else
uint32_t Hardware(uint32_t crc, const void* data, size_t n) {
  return crc32c_internal::ExtendPortable(crc, data, n);
}
bool DetectHardware() { return false; }
#endif

bool HasHardware() {
  static const bool has = DetectHardware();
  return has;
}

}  // namespace

namespace crc32c_internal {

uint32_t ExtendPortable(uint32_t crc, const void* data, size_t n) {
  const Tables& tables = GetTables();
  const auto& t = tables.t;
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = crc ^ 0xffffffffu;
  for (; n >= 8; n -= 8, p += 8) {
    // Little-endian: the low word holds the first four bytes.
    const uint64_t v = Load64(p) ^ c;
    c = t[7][v & 0xff] ^ t[6][(v >> 8) & 0xff] ^ t[5][(v >> 16) & 0xff] ^
        t[4][(v >> 24) & 0xff] ^ t[3][(v >> 32) & 0xff] ^
        t[2][(v >> 40) & 0xff] ^ t[1][(v >> 48) & 0xff] ^ t[0][v >> 56];
  }
  for (; n > 0; --n, ++p) c = (c >> 8) ^ t[0][(c ^ *p) & 0xff];
  return c ^ 0xffffffffu;
}

uint32_t ExtendHardware(uint32_t crc, const void* data, size_t n) {
  return Hardware(crc, data, n);
}

}  // namespace crc32c_internal

bool Crc32cUsesHardware() { return HasHardware(); }

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n) {
  return HasHardware() ? Hardware(crc, data, n)
                       : crc32c_internal::ExtendPortable(crc, data, n);
}

}  // namespace gradcomp
