// How a flattened tensor is split among the ranks, the same way by the SUM
// rounds' reduce-scatter (peer_collective.h) and by sharded aggregation
// (sharded_reduce.h): rank j owns the contiguous slice [n*j/w, n*(j+1)/w).
//
//   const Slice mine = SliceOf(numel, world_size, rank);
//   absl::Span<float> part = absl::MakeSpan(values).subspan(mine.begin,
//   mine.size);
#ifndef GRADCOMP_SERVICE_COLLECTIVE_SLICE_H_
#define GRADCOMP_SERVICE_COLLECTIVE_SLICE_H_

#include <cstddef>

namespace gradcomp::service {

struct Slice {
  size_t begin;
  size_t size;
};

// Slice j of n elements over w ranks (0 <= j < w). The W slices are
// contiguous, in rank order, cover [0, n) and differ in size by at most one.
inline Slice SliceOf(size_t n, int w, int j) {
  const size_t begin = n * j / w;
  return {begin, n * (j + 1) / w - begin};
}

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_COLLECTIVE_SLICE_H_
