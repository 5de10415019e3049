#include "codecs/cuda/select.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "codecs/cuda/device.h"
#include "codecs/cuda/philox_words.h"
#include "codecs/cuda/select_kernels.h"

namespace gradcomp::codecs::cuda {
namespace {

// codecs/cpu/select.cc's constants: at most 10 filter passes, another one
// while fewer than 0.8k are found, each at 0.8 times the threshold; key 1
// (the smallest subnormal) keeps exactly the nonzero magnitudes.
constexpr int kMaxPasses = 10;
constexpr double kTooFew = 0.8;
constexpr float kLowerBy = 0.8f;
constexpr uint32_t kSmallestKey = 1;

uint32_t KeyOf(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return bits & 0x7FFFFFFFu;
}

float FromKey(uint32_t key) {
  float x;
  std::memcpy(&x, &key, sizeof(x));
  return x;
}

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

struct Candidate {
  uint32_t key;
  uint32_t index;
};

// codecs/cpu/select.cc's order of selection: larger magnitude first, then
// the lower index. It is total, so the k first candidates are one set
// however they are found.
bool Before(const Candidate& a, const Candidate& b) {
  return a.key > b.key || (a.key == b.key && a.index < b.index);
}

// Keeps the k of more than k ascending `indices` that come first in Before
// order, still ascending; `keys` are their keys.
void TrimToTopK(const std::vector<uint32_t>& keys, size_t k,
                std::vector<uint32_t>* indices) {
  std::vector<Candidate> candidates(indices->size());
  for (size_t j = 0; j < indices->size(); ++j) {
    candidates[j] = {keys[j], (*indices)[j]};
  }
  std::vector<Candidate> partitioned = candidates;
  std::nth_element(partitioned.begin(), partitioned.begin() + k,
                   partitioned.end(), Before);
  const Candidate first_dropped = partitioned[k];
  indices->clear();
  for (const Candidate& c : candidates) {
    if (Before(c, first_dropped)) indices->push_back(c.index);
  }
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

  const double wanted = std::max(
      std::ceil(sample_fraction * static_cast<double>(n)),
      std::ceil(2.0 * static_cast<double>(n) / static_cast<double>(k)));
  const bool exact = k == n || wanted >= static_cast<double>(n);
  uint32_t threshold = kSmallestKey;
  if (k == n) {
    result.sample_size = n;
  } else {
    // Exact: the k-th largest of every key. Sampled: the
    // ceil(k * count / n)-th largest of the sample.
    const size_t count = exact ? n : static_cast<size_t>(wanted);
    const size_t rank =
        exact ? k
              : std::min<size_t>(
                    count, (static_cast<uint64_t>(k) * count + n - 1) / n);
    GC_ASSIGN_OR_RETURN(DeviceBuffer keys,
                        DeviceBuffer::Create(count * sizeof(uint32_t)));
    if (exact) {
      GC_CUDA_RETURN_IF_ERROR(
          LaunchGatherKeys(x, nullptr, n, keys.as<uint32_t>(), nullptr));
    } else {
      GC_CUDA_RETURN_IF_ERROR(LaunchStratifiedSample(
          x, n, count, ToPhiloxWords(rng), keys.as<uint32_t>(), nullptr));
    }
    GC_ASSIGN_OR_RETURN(threshold,
                        NthLargest(keys.as<uint32_t>(), count, rank - 1));
    result.sample_size = count;
  }
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
    if (exact || result.passes == kMaxPasses || threshold == kSmallestKey ||
        static_cast<double>(found) >= kTooFew * static_cast<double>(k)) {
      break;
    }
    // As on the CPU: a non-finite threshold steps down from FLT_MAX.
    const float current = FromKey(threshold);
    const float lowered =
        (std::isfinite(current) ? current : std::numeric_limits<float>::max()) *
        kLowerBy;
    threshold = std::max(KeyOf(lowered), kSmallestKey);
  }
  result.threshold = FromKey(threshold);

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
