// Conversions between fp32 and the 16-bit float formats IEEE fp16 and bfloat16,
// rounding to nearest even. NaN stays NaN (quietened), Inf stays Inf.
//
//   FloatToHalf(values, /*scale=*/1.0f, body);  // body[i] = fp16(values[i])
//   AddHalf(body, /*alpha=*/0.25f, acc);         // acc[i] += 0.25f * body[i]
//
// The span functions take 16-bit data through untyped pointers because payload
// bodies have no alignment; they use F16C/AVX2 when the CPU has them (checked
// at run time, no -march needed) and split large tensors over threads.
#ifndef GRADCOMP_CODECS_CPU_HALF_H_
#define GRADCOMP_CODECS_CPU_HALF_H_

#include <cstddef>
#include <cstdint>

#include "absl/types/span.h"

namespace gradcomp::codecs {

// Scalar conversions: the reference the span functions agree with bit for bit.
uint16_t FloatToHalfBits(float f);
float HalfBitsToFloat(uint16_t h);
uint16_t FloatToBf16Bits(float f);
float Bf16BitsToFloat(uint16_t b);

// out[i] = 16-bit(in[i] * scale); `out` holds 2 * in.size() bytes. The
// product is rounded to fp32 first, then to 16 bits.
void FloatToHalf(absl::Span<const float> in, float scale, void* out);
void FloatToBf16(absl::Span<const float> in, float scale, void* out);
// out[i] = in[i] * scale, in fp32; `out` holds 4 * in.size() bytes.
void ScaleFloat(absl::Span<const float> in, float scale, void* out);

// out[i] = fp32(in[i]); `in` holds 2 * out.size() bytes.
void HalfToFloat(const void* in, absl::Span<float> out);
void Bf16ToFloat(const void* in, absl::Span<float> out);

// acc[i] += alpha * fp32(in[i]) (a product and a sum, never fused, so the
// result does not depend on the CPU).
void AddHalf(const void* in, float alpha, absl::Span<float> acc);
void AddBf16(const void* in, float alpha, absl::Span<float> acc);
void AddFloat(const void* in, float alpha, absl::Span<float> acc);

// Whether the span functions currently take the F16C/AVX2 path.
bool HalfSimdActive();

// Tests force the portable path with true, and restore dispatch with false.
void DisableHalfSimdForTesting(bool disable);

}  // namespace gradcomp::codecs

#endif  // GRADCOMP_CODECS_CPU_HALF_H_
