#include "codecs/cuda/select.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "codecs/cpu/select_rules.h"
#include "codecs/cuda/device.h"
#include "codecs/cuda/philox_words.h"
#include "codecs/cuda/select_kernels.h"

namespace gradcomp::codecs::cuda {
namespace {

// The rank-th largest (0-based) of `count` keys in device memory.
absl::StatusOr<uint32_t> NthLargest(const uint32_t* keys, size_t count,
                                    size_t rank) {
  GC_ASSIGN_OR_RETURN(DeviceBuffer sorted,
                      DeviceBuffer::Create(count * sizeof(uint32_t)));
  size_t temp_bytes = 0;
  GC_CUDA_RETURN_IF_ERROR(SortKeysDescending(
      nullptr, temp_bytes, keys, sorted.as<uint32_t>(), count, nullptr));
  GC_ASSIGN_OR_RETURN(DeviceBuffer temp, DeviceBuffer::Create(temp_bytes));
  GC_CUDA_RETURN_IF_ERROR(SortKeysDescending(
      temp.data(), temp_bytes, keys, sorted.as<uint32_t>(), count, nullptr));
  uint32_t key = 0;
  GC_CUDA_RETURN_IF_ERROR(cudaMemcpy(&key, sorted.as<uint32_t>() + rank,
                                     sizeof(key), cudaMemcpyDeviceToHost));
  return key;
}

}  // namespace

absl::StatusOr<TopKSelection> SelectTopKDevice(const float* x, size_t n,
                                               size_t k, double sample_fraction,
                                               const PhiloxStream& rng) {
  TopKSelection result;
  if (n == 0 || k == 0) return result;
  if (n > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "top-k selection: %d elements; uint32 indices allow at most %d", n,
        std::numeric_limits<uint32_t>::max()));
  }
  GC_RETURN_IF_ERROR(CudaDeviceAvailable());
  k = std::min(k, n);

  const SelectPlan plan = PlanSelection(n, k, sample_fraction);
  uint32_t threshold = kSmallestKey;
  if (plan.rank > 0) {
    GC_ASSIGN_OR_RETURN(DeviceBuffer keys,
                        DeviceBuffer::Create(plan.sample * sizeof(uint32_t)));
    if (plan.exact) {
      GC_CUDA_RETURN_IF_ERROR(
          LaunchGatherKeys(x, nullptr, n, keys.as<uint32_t>(), nullptr));
    } else {
      GC_CUDA_RETURN_IF_ERROR(LaunchStratifiedSample(
          x, n, plan.sample, ToPhiloxWords(rng), keys.as<uint32_t>(), nullptr));
    }
    GC_ASSIGN_OR_RETURN(
        threshold, NthLargest(keys.as<uint32_t>(), plan.sample, plan.rank - 1));
  }
  result.sample_size = plan.sample;
  threshold = std::max(threshold, kSmallestKey);

  GC_ASSIGN_OR_RETURN(DeviceBuffer indices,
                      DeviceBuffer::Create(n * sizeof(uint32_t)));
  GC_ASSIGN_OR_RETURN(DeviceBuffer selected,
                      DeviceBuffer::Create(sizeof(int64_t)));
  size_t temp_bytes = 0;
  GC_CUDA_RETURN_IF_ERROR(SelectAtLeast(nullptr, temp_bytes, x, n, threshold,
                                        indices.as<uint32_t>(),
                                        selected.as<int64_t>(), nullptr));
  GC_ASSIGN_OR_RETURN(DeviceBuffer temp, DeviceBuffer::Create(temp_bytes));
  int64_t found = 0;
  while (true) {
    GC_CUDA_RETURN_IF_ERROR(SelectAtLeast(temp.data(), temp_bytes, x, n,
                                          threshold, indices.as<uint32_t>(),
                                          selected.as<int64_t>(), nullptr));
    GC_CUDA_RETURN_IF_ERROR(cudaMemcpy(&found, selected.data(), sizeof(found),
                                       cudaMemcpyDeviceToHost));
    ++result.passes;
    if (!AnotherPass(plan, result.passes, threshold, static_cast<size_t>(found),
                     k)) {
      break;
    }
    threshold = LowerThreshold(threshold);
  }
  result.threshold = FromMagnitudeKey(threshold);

  const size_t count = static_cast<size_t>(found);
  result.indices.resize(count);
  if (count > 0) {
    GC_CUDA_RETURN_IF_ERROR(cudaMemcpy(result.indices.data(), indices.data(),
                                       count * sizeof(uint32_t),
                                       cudaMemcpyDeviceToHost));
  }
  if (count > k) {
    // The candidates' keys, gathered on the device, trimmed on the host.
    GC_ASSIGN_OR_RETURN(DeviceBuffer keys,
                        DeviceBuffer::Create(count * sizeof(uint32_t)));
    GC_CUDA_RETURN_IF_ERROR(LaunchGatherKeys(x, indices.as<uint32_t>(), count,
                                             keys.as<uint32_t>(), nullptr));
    std::vector<uint32_t> host_keys(count);
    GC_CUDA_RETURN_IF_ERROR(cudaMemcpy(host_keys.data(), keys.data(),
                                       count * sizeof(uint32_t),
                                       cudaMemcpyDeviceToHost));
    TrimToTopK(host_keys, k, &result.indices);
  }
  return result;
}

}  // namespace gradcomp::codecs::cuda
