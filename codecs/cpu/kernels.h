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

// Sum of x[i]^2 in a fixed order: 8 fp32 lanes (lane j takes i = j mod 8),
// each 256-element block's lanes folded into a double in lane order, the
// tail added last. Fixed so that other backends can match it exactly.
double SumOfSquares(absl::Span<const float> x);

// The same sum for a short bucket (at most a few thousand elements), all in
// fp32: the 8 lanes, then the lanes added in order, then the tail.
float BucketSumOfSquares(absl::Span<const float> x);

// A Philox stream private to this worker: keyed by (seed mixed with rank,
// tensor, step, round). Stochastic rounding must be independent across
// workers, or averaging W payloads would not shrink its variance by 1/W.
PhiloxStream WorkerStream(const StepContext& ctx, uint32_t round);

}  // namespace gradcomp::codecs

#endif  // GRADCOMP_CODECS_CPU_KERNELS_H_
