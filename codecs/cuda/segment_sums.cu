// Per-segment sums of doubles: each thread adds a run of at most kRun terms
// of one segment, then adds its run's sum into the segment (atomically when
// a segment has several runs).
#include <cstddef>
#include <cstdint>

#include "codecs/cuda/segment_sums.h"

namespace gradcomp::codecs::cuda {
namespace {

constexpr int kThreads = 256;
constexpr size_t kRun = 64;

__global__ void SegmentSumsKernel(const double* __restrict__ in, size_t count,
                                  size_t per_segment, size_t runs_per_segment,
                                  size_t runs, double* __restrict__ sums) {
  const size_t t = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool live = t < runs;
  const size_t segment = live ? t / runs_per_segment : 0;
  double sum = 0;
  if (live) {
    const size_t run = t % runs_per_segment;
    const size_t segment_end = per_segment * (segment + 1) < count
                                   ? per_segment * (segment + 1)
                                   : count;
    const size_t begin = segment * per_segment + run * kRun;
    const size_t end = begin + kRun < segment_end ? begin + kRun : segment_end;
    for (size_t i = begin; i < end; ++i) sum = __dadd_rn(sum, in[i]);
  }
  if (runs_per_segment == 1) {
    if (live) sums[segment] = sum;
    return;
  }
  // A warp whose runs all lie in one segment adds once (one segment over a
  // whole tensor would otherwise take an atomic per run).
  const size_t first = __shfl_sync(0xFFFFFFFFu, segment, 0);
  const bool shared = __all_sync(0xFFFFFFFFu, !live || segment == first);
  if (!shared) {
    if (live) atomicAdd(sums + segment, sum);
    return;
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    sum = __dadd_rn(sum, __shfl_down_sync(0xFFFFFFFFu, sum, offset));
  }
  if (threadIdx.x % 32 == 0 && live) atomicAdd(sums + first, sum);
}

}  // namespace

cudaError_t LaunchSegmentSums(const double* in, size_t count,
                              size_t per_segment, double* sums,
                              cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  const size_t segments = (count + per_segment - 1) / per_segment;
  const size_t longest = per_segment < count ? per_segment : count;
  const size_t runs_per_segment = (longest + kRun - 1) / kRun;
  if (runs_per_segment > 1) {
    const cudaError_t error =
        cudaMemsetAsync(sums, 0, segments * sizeof(double), stream);
    if (error != cudaSuccess) return error;
  }
  const size_t runs = segments * runs_per_segment;
  const size_t blocks = (runs + kThreads - 1) / kThreads;
  SegmentSumsKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      in, count, per_segment, runs_per_segment, runs, sums);
  return cudaGetLastError();
}

}  // namespace gradcomp::codecs::cuda
