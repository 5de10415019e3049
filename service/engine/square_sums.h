// The sums of squares behind a reduce's compression metrics: the relative
// error ||g - decode(own payload)|| / ||g|| and the residual's norm.
#ifndef GRADCOMP_SERVICE_ENGINE_SQUARE_SUMS_H_
#define GRADCOMP_SERVICE_ENGINE_SQUARE_SUMS_H_

#include "absl/types/span.h"

namespace gradcomp::service {

struct SquareSums {
  double diff = 0;  // ||a - b||^2 (0 without b)
  double norm = 0;  // ||a||^2
};

// ||a - b||^2 and ||a||^2 in double, or with `b` empty ||a||^2 alone; `b`
// otherwise has a's size. The sum's order is fixed, so the result is the
// same from run to run and machine to machine.
SquareSums SumSquares(absl::Span<const float> a, absl::Span<const float> b);

// ||a - b|| / ||a|| from SumSquares(a, b); NaN when ||a|| = 0.
double RelativeError(const SquareSums& sums);

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_ENGINE_SQUARE_SUMS_H_
