#include "bench/cuda_timer.h"

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "base/status_macros.h"
#include "codecs/cuda/device.h"

namespace gradcomp::bench {
namespace {

// Destroys the two events however the timing ends.
struct EventPair {
  cudaEvent_t start = nullptr;
  cudaEvent_t stop = nullptr;
  ~EventPair() {
    if (start != nullptr) cudaEventDestroy(start);
    if (stop != nullptr) cudaEventDestroy(stop);
  }
};

}  // namespace

absl::StatusOr<double> TimeCudaMs(const std::function<absl::Status()>& launch,
                                  int warmup, int reps) {
  for (int i = 0; i < warmup; ++i) GC_RETURN_IF_ERROR(launch());
  EventPair events;
  GC_CUDA_RETURN_IF_ERROR(cudaEventCreate(&events.start));
  GC_CUDA_RETURN_IF_ERROR(cudaEventCreate(&events.stop));
  GC_CUDA_RETURN_IF_ERROR(cudaEventRecord(events.start));
  for (int i = 0; i < reps; ++i) GC_RETURN_IF_ERROR(launch());
  GC_CUDA_RETURN_IF_ERROR(cudaEventRecord(events.stop));
  GC_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(events.stop));
  float ms = 0;
  GC_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, events.start, events.stop));
  return ms / reps;
}

}  // namespace gradcomp::bench
