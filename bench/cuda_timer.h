// Device time of a launch sequence, measured with CUDA events on the default
// stream, as the GPU benchmarks report it: `warmup` untimed runs, then the
// mean of `reps` timed back to back.
//
//   absl::StatusOr<double> ms = TimeCudaMs([&] { return Launch(); }, 3, 20);
#ifndef GRADCOMP_BENCH_CUDA_TIMER_H_
#define GRADCOMP_BENCH_CUDA_TIMER_H_

#include <functional>

#include "absl/status/statusor.h"

namespace gradcomp::bench {

// Mean milliseconds of `launch` over `reps` runs after `warmup`; the first
// error from `launch` or from the CUDA runtime instead.
absl::StatusOr<double> TimeCudaMs(const std::function<absl::Status()>& launch,
                                  int warmup, int reps);

}  // namespace gradcomp::bench

#endif  // GRADCOMP_BENCH_CUDA_TIMER_H_
