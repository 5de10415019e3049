// Splits a loop over [0, n) into contiguous parts run on the machine's cores,
// for the few CPU kernels whose tensors are large enough to pay for threads.
//
//   ParallelFor(n, {/*min_per_part=*/1 << 20, /*align=*/512},
//               [&](size_t begin, size_t end, int part) { ... });
#ifndef GRADCOMP_CODECS_CPU_PARALLEL_H_
#define GRADCOMP_CODECS_CPU_PARALLEL_H_

#include <cstddef>

#include "absl/functional/function_ref.h"

namespace gradcomp::codecs {

struct ParallelOptions {
  // A part gets at least this many elements; below it threads cost more than
  // they save (a thread start is tens of microseconds).
  size_t min_per_part = size_t{1} << 20;
  // Every part but the last starts and ends on a multiple of `align` (a
  // bucket, or the elements of one packed byte).
  size_t align = 1;
};

// The number of parts ParallelFor(n, options, ...) will run.
int ParallelParts(size_t n, const ParallelOptions& options);

// Runs fn(begin, end, part) for ParallelParts(n, options) disjoint ranges
// covering [0, n) in order, part 0 on the calling thread and the others on
// threads kept for the process's life (or on the calling thread, when they
// are busy), and returns when all have finished. fn must not throw; it may
// call ParallelFor itself.
void ParallelFor(
    size_t n, const ParallelOptions& options,
    absl::FunctionRef<void(size_t begin, size_t end, int part)> fn);

// While alive, ParallelParts and ParallelFor use `threads` (>= 1) in place of
// the machine's core count, for tests that check that a kernel's result does
// not depend on how many threads ran it. Not for concurrent use: one at a
// time, in a test's main thread.
class ScopedParallelThreads {
 public:
  explicit ScopedParallelThreads(int threads);
  ~ScopedParallelThreads();
  ScopedParallelThreads(const ScopedParallelThreads&) = delete;
  ScopedParallelThreads& operator=(const ScopedParallelThreads&) = delete;

 private:
  int previous_;
};

}  // namespace gradcomp::codecs

#endif  // GRADCOMP_CODECS_CPU_PARALLEL_H_
