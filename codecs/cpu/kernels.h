// Small numeric kernels shared by the CPU codecs, written so that the
// compiler vectorises them and a CUDA kernel can reproduce them bit for bit.
//
//   double norm2 = SumOfSquares(v);
//   PhiloxStream rng = WorkerStream(ctx, /*round=*/0);
#ifndef GRADCOMP_CODECS_CPU_KERNELS_H_
#define GRADCOMP_CODECS_CPU_KERNELS_H_

#include "absl/types/span.h"
#include "codecs/codec.h"
#include "codecs/random.h"

namespace gradcomp::codecs {

// Below this an fp32 sum of squares may have lost squares to underflow: a
// square under FLT_MIN keeps fewer bits, and under about 7e-46 it is 0,
// so a bucket of normal floats near 1e-25 summed to 0 and was sent as
// zeros. There, SumOfSquares and BucketNorm take the double sum instead,
// in which no square of a float underflows. At or above it, the squares
// lost (each under FLT_MIN) are at most 2^-38 of the sum for 2^24 values.
// The CUDA codecs take the host's path where their fp32 sum is below it.
inline constexpr float kTinySumOfSquares = 0x1p-64f;

// Sum of x[i]^2 in a fixed order: 8 fp32 lanes (lane j takes i = j mod 8),
// each 256-element block's lanes folded into a double in lane order, the
// tail added last. Fixed so that other backends can match it exactly.
// A square of |x| above about 1.8e19 overflows an fp32 lane: where that
// makes the sum non-finite though every x[i] is finite, it is taken again
// in double (x[i]^2 exact, added in index order), which no finite input
// overflows. So the sum is finite exactly when x is. A sum below
// kTinySumOfSquares is taken again in double too.
double SumOfSquares(absl::Span<const float> x);

// The same sum for a short bucket (at most a few thousand elements), all in
// fp32: the 8 lanes, then the lanes added in order, then the tail. Inf where
// a square overflows fp32; BucketNorm is the norm that does not.
float BucketSumOfSquares(absl::Span<const float> x);

// The L2 norm of a bucket: sqrt(BucketSumOfSquares(x)) in fp32, or, where
// that overflows though every x[i] is finite or is below
// kTinySumOfSquares, the square root of the double sum SumOfSquares falls
// back to, rounded to fp32. Not finite only when x holds NaN or Inf or the
// norm itself exceeds FLT_MAX.
float BucketNorm(absl::Span<const float> x);

// Whether every x[i] is finite (no NaN or Inf), in one branch-free pass.
bool AllFinite(absl::Span<const float> x);

// A Philox stream private to this worker: keyed by (seed mixed with rank,
// tensor, step, round). Stochastic rounding must be independent across
// workers, or averaging W payloads would not shrink its variance by 1/W.
PhiloxStream WorkerStream(const StepContext& ctx, uint32_t round);

}  // namespace gradcomp::codecs

#endif  // GRADCOMP_CODECS_CPU_KERNELS_H_
