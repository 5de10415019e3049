#include "codecs/cpu/half.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define GC_HALF_X86 1
#endif

#include "codecs/cpu/parallel.h"

namespace gradcomp::codecs {
namespace {

uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

uint16_t Load16(const char* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

void Store16(char* p, uint16_t v) { std::memcpy(p, &v, sizeof(v)); }

// Runs fn(begin, end) over [0, n) in parts on the kept threads of
// codecs::ParallelFor when n is large (2^20 elements a part: below that a
// thread costs more than it saves; above it the conversion is bound by
// memory bandwidth, which one core does not saturate). Parts start on a
// multiple of 64 elements, so every part runs whole SIMD blocks.
template <typename Fn>
void InParts(size_t n, const Fn& fn) {
  ParallelOptions options;
  options.min_per_part = size_t{1} << 20;
  options.align = 64;
  ParallelFor(n, options,
              [&fn](size_t begin, size_t end, int) { fn(begin, end); });
}

// ---- Portable loops (also the tails of the SIMD loops). ----

void FloatToHalfPortable(const float* in, size_t n, float scale, char* out) {
  for (size_t i = 0; i < n; ++i)
    Store16(out + 2 * i, FloatToHalfBits(in[i] * scale));
}

void FloatToBf16Portable(const float* in, size_t n, float scale, char* out) {
  for (size_t i = 0; i < n; ++i)
    Store16(out + 2 * i, FloatToBf16Bits(in[i] * scale));
}

void ScaleFloatPortable(const float* in, size_t n, float scale, char* out) {
  for (size_t i = 0; i < n; ++i) {
    const float v = in[i] * scale;
    std::memcpy(out + 4 * i, &v, sizeof(v));
  }
}

void HalfToFloatPortable(const char* in, size_t n, float* out) {
  for (size_t i = 0; i < n; ++i) out[i] = HalfBitsToFloat(Load16(in + 2 * i));
}

void Bf16ToFloatPortable(const char* in, size_t n, float* out) {
  for (size_t i = 0; i < n; ++i) out[i] = Bf16BitsToFloat(Load16(in + 2 * i));
}

void AddHalfPortable(const char* in, size_t n, float alpha, float* acc) {
  for (size_t i = 0; i < n; ++i) {
    const float product = alpha * HalfBitsToFloat(Load16(in + 2 * i));
    acc[i] += product;
  }
}

void AddBf16Portable(const char* in, size_t n, float alpha, float* acc) {
  for (size_t i = 0; i < n; ++i) {
    const float product = alpha * Bf16BitsToFloat(Load16(in + 2 * i));
    acc[i] += product;
  }
}

void AddFloatPortable(const char* in, size_t n, float alpha, float* acc) {
  for (size_t i = 0; i < n; ++i) {
    float v;
    std::memcpy(&v, in + 4 * i, sizeof(v));
    const float product = alpha * v;
    acc[i] += product;
  }
}

#ifdef GC_HALF_X86
#define GC_AVX2 __attribute__((target("avx2,f16c")))

// vcvtps2ph/vcvtph2ps round to nearest even and quieten NaNs exactly as the
// scalar functions do, so both paths give identical bits.
GC_AVX2 void FloatToHalfAvx2(const float* in, size_t n, float scale,
                             char* out) {
  const __m256 s = _mm256_set1_ps(scale);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 a = _mm256_mul_ps(_mm256_loadu_ps(in + i), s);
    const __m256 b = _mm256_mul_ps(_mm256_loadu_ps(in + i + 8), s);
    const __m128i ha = _mm256_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT);
    const __m128i hb = _mm256_cvtps_ph(b, _MM_FROUND_TO_NEAREST_INT);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2 * i),
                        _mm256_set_m128i(hb, ha));
  }
  FloatToHalfPortable(in + i, n - i, scale, out + 2 * i);
}

// Eight floats to eight bf16 in the low 16 bits of each 32-bit lane.
GC_AVX2 __m256i Bf16Lanes(__m256 v) {
  const __m256i x = _mm256_castps_si256(v);
  const __m256i lsb =
      _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_add_epi32(x, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF)));
  const __m256i abs = _mm256_and_si256(x, _mm256_set1_epi32(0x7FFFFFFF));
  const __m256i is_nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7F800000));
  const __m256i quiet = _mm256_or_si256(x, _mm256_set1_epi32(0x00400000));
  return _mm256_srli_epi32(_mm256_blendv_epi8(rounded, quiet, is_nan), 16);
}

GC_AVX2 void FloatToBf16Avx2(const float* in, size_t n, float scale,
                             char* out) {
  const __m256 s = _mm256_set1_ps(scale);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i a = Bf16Lanes(_mm256_mul_ps(_mm256_loadu_ps(in + i), s));
    const __m256i b = Bf16Lanes(_mm256_mul_ps(_mm256_loadu_ps(in + i + 8), s));
    // packus works per 128-bit lane: a0-3 b0-3 | a4-7 b4-7; reorder quarters.
    const __m256i packed =
        _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xD8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 2 * i), packed);
  }
  FloatToBf16Portable(in + i, n - i, scale, out + 2 * i);
}

GC_AVX2 void ScaleFloatAvx2(const float* in, size_t n, float scale, char* out) {
  const __m256 s = _mm256_set1_ps(scale);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(reinterpret_cast<float*>(out + 4 * i),
                     _mm256_mul_ps(_mm256_loadu_ps(in + i), s));
  }
  ScaleFloatPortable(in + i, n - i, scale, out + 4 * i);
}

GC_AVX2 __m256 LoadHalf8(const char* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

GC_AVX2 __m256 LoadBf16x8(const char* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

GC_AVX2 void HalfToFloatAvx2(const char* in, size_t n, float* out) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, LoadHalf8(in + 2 * i));
  HalfToFloatPortable(in + 2 * i, n - i, out + i);
}

GC_AVX2 void Bf16ToFloatAvx2(const char* in, size_t n, float* out) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, LoadBf16x8(in + 2 * i));
  Bf16ToFloatPortable(in + 2 * i, n - i, out + i);
}

GC_AVX2 void AddHalfAvx2(const char* in, size_t n, float alpha, float* acc) {
  const __m256 a = _mm256_set1_ps(alpha);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 product = _mm256_mul_ps(a, LoadHalf8(in + 2 * i));
    _mm256_storeu_ps(acc + i, _mm256_add_ps(_mm256_loadu_ps(acc + i), product));
  }
  AddHalfPortable(in + 2 * i, n - i, alpha, acc + i);
}

GC_AVX2 void AddBf16Avx2(const char* in, size_t n, float alpha, float* acc) {
  const __m256 a = _mm256_set1_ps(alpha);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 product = _mm256_mul_ps(a, LoadBf16x8(in + 2 * i));
    _mm256_storeu_ps(acc + i, _mm256_add_ps(_mm256_loadu_ps(acc + i), product));
  }
  AddBf16Portable(in + 2 * i, n - i, alpha, acc + i);
}

GC_AVX2 void AddFloatAvx2(const char* in, size_t n, float alpha, float* acc) {
  const __m256 a = _mm256_set1_ps(alpha);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v =
        _mm256_loadu_ps(reinterpret_cast<const float*>(in + 4 * i));
    _mm256_storeu_ps(
        acc + i, _mm256_add_ps(_mm256_loadu_ps(acc + i), _mm256_mul_ps(a, v)));
  }
  AddFloatPortable(in + 4 * i, n - i, alpha, acc + i);
}

bool CpuHasAvx2F16c() {
  // CPUID leaf 1 rather than __builtin_cpu_supports("f16c"), which clang 14
  // (the fuzz build, docs/fuzzing.md) does not know.
  static const bool has = [] {
    unsigned eax, ebx, ecx, edx;
    return __builtin_cpu_supports("avx2") &&
           __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
  }();
  return has;
}
#else
bool CpuHasAvx2F16c() { return false; }
#endif  // GC_HALF_X86

std::atomic<bool> simd_disabled{false};

bool UseSimd() {
  return CpuHasAvx2F16c() && !simd_disabled.load(std::memory_order_relaxed);
}

// Picks the SIMD or the portable kernel once per call.
#ifdef GC_HALF_X86
#define GC_PICK(name) (UseSimd() ? name##Avx2 : name##Portable)
#else
#define GC_PICK(name) (name##Portable)
#endif

}  // namespace

uint16_t FloatToHalfBits(float f) {
  const uint32_t x = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  uint32_t abs = x & 0x7FFFFFFF;
  if (abs > 0x7F800000) {  // NaN: keep the top payload bits, set quiet.
    return sign | 0x7E00 | static_cast<uint16_t>((abs >> 13) & 0x3FF);
  }
  // 65520 = 65504 + half an ulp: from there on, nearest-even gives infinity.
  if (abs >= 0x477FF000) return sign | 0x7C00;
  if (abs < 0x38800000) {
    // Below 2^-14 the result is subnormal with a step of 2^-24. Adding 0.5
    // (whose ulp is 2^-24) lets the FPU round to nearest even for us; the
    // mantissa then is the half's bits.
    const float shifted = BitsFloat(abs) + 0.5f;
    return sign | static_cast<uint16_t>(FloatBits(shifted) - 0x3F000000u);
  }
  // Rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits to
  // nearest even: add 0xFFF plus the lowest kept bit, then truncate.
  const uint32_t lowest_kept = (abs >> 13) & 1;
  abs += (static_cast<uint32_t>(15 - 127) << 23) + 0xFFF + lowest_kept;
  return sign | static_cast<uint16_t>(abs >> 13);
}

float HalfBitsToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exponent = (h >> 10) & 0x1F;
  const uint32_t mantissa = h & 0x3FF;
  if (exponent == 0x1F) {  // Inf, or NaN made quiet (as vcvtph2ps does).
    const uint32_t quiet = mantissa != 0 ? 0x00400000u : 0u;
    return BitsFloat(sign | 0x7F800000u | quiet | (mantissa << 13));
  }
  if (exponent == 0) {  // Zero or subnormal: mantissa * 2^-24, exact in fp32.
    const float magnitude =
        static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return sign != 0 ? -magnitude : magnitude;
  }
  return BitsFloat(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

uint16_t FloatToBf16Bits(float f) {
  const uint32_t x = FloatBits(f);
  if ((x & 0x7FFFFFFF) > 0x7F800000) {
    return static_cast<uint16_t>((x | 0x00400000u) >> 16);
  }
  const uint32_t lowest_kept = (x >> 16) & 1;
  return static_cast<uint16_t>((x + 0x7FFF + lowest_kept) >> 16);
}

float Bf16BitsToFloat(uint16_t b) {
  return BitsFloat(static_cast<uint32_t>(b) << 16);
}

void FloatToHalf(absl::Span<const float> in, float scale, void* out) {
  const auto kernel = GC_PICK(FloatToHalf);
  char* bytes = static_cast<char*>(out);
  InParts(in.size(), [&](size_t begin, size_t end) {
    kernel(in.data() + begin, end - begin, scale, bytes + 2 * begin);
  });
}

void FloatToBf16(absl::Span<const float> in, float scale, void* out) {
  const auto kernel = GC_PICK(FloatToBf16);
  char* bytes = static_cast<char*>(out);
  InParts(in.size(), [&](size_t begin, size_t end) {
    kernel(in.data() + begin, end - begin, scale, bytes + 2 * begin);
  });
}

void ScaleFloat(absl::Span<const float> in, float scale, void* out) {
  const auto kernel = GC_PICK(ScaleFloat);
  char* bytes = static_cast<char*>(out);
  InParts(in.size(), [&](size_t begin, size_t end) {
    kernel(in.data() + begin, end - begin, scale, bytes + 4 * begin);
  });
}

void HalfToFloat(const void* in, absl::Span<float> out) {
  const auto kernel = GC_PICK(HalfToFloat);
  const char* bytes = static_cast<const char*>(in);
  InParts(out.size(), [&](size_t begin, size_t end) {
    kernel(bytes + 2 * begin, end - begin, out.data() + begin);
  });
}

void Bf16ToFloat(const void* in, absl::Span<float> out) {
  const auto kernel = GC_PICK(Bf16ToFloat);
  const char* bytes = static_cast<const char*>(in);
  InParts(out.size(), [&](size_t begin, size_t end) {
    kernel(bytes + 2 * begin, end - begin, out.data() + begin);
  });
}

void AddHalf(const void* in, float alpha, absl::Span<float> acc) {
  const auto kernel = GC_PICK(AddHalf);
  const char* bytes = static_cast<const char*>(in);
  InParts(acc.size(), [&](size_t begin, size_t end) {
    kernel(bytes + 2 * begin, end - begin, alpha, acc.data() + begin);
  });
}

void AddBf16(const void* in, float alpha, absl::Span<float> acc) {
  const auto kernel = GC_PICK(AddBf16);
  const char* bytes = static_cast<const char*>(in);
  InParts(acc.size(), [&](size_t begin, size_t end) {
    kernel(bytes + 2 * begin, end - begin, alpha, acc.data() + begin);
  });
}

void AddFloat(const void* in, float alpha, absl::Span<float> acc) {
  const auto kernel = GC_PICK(AddFloat);
  const char* bytes = static_cast<const char*>(in);
  InParts(acc.size(), [&](size_t begin, size_t end) {
    kernel(bytes + 4 * begin, end - begin, alpha, acc.data() + begin);
  });
}

bool HalfSimdActive() { return UseSimd(); }

void DisableHalfSimdForTesting(bool disable) {
  simd_disabled.store(disable, std::memory_order_relaxed);
}

}  // namespace gradcomp::codecs
