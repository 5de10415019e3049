#include "codecs/cuda/select.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "codecs/cpu/select_rules.h"
#include "codecs/cuda/device.h"
#include "codecs/cuda/philox_words.h"
#include "codecs/cuda/select_kernels.h"

namespace gradcomp::codecs::cuda {
namespace {

// The default stream: the selection's steps run in its order, and the host
// waits on it once per pass, for the pass's count and the kept indices.
constexpr cudaStream_t kStream = nullptr;

// Candidates a first pass has room for: about k are expected; the buffer
// grows (and the pass repeats) only when more are found.
size_t InitialCapacity(size_t n, size_t k) { return std::min(n, 2 * k + 4096); }

// Page-locked host memory (device copies into it run at full speed and
// without a staging copy), freed on destruction.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() {
    if (data_ != nullptr) cudaFreeHost(data_);
  }

  // At least `bytes`; the contents are not kept.
  absl::Status Reserve(size_t bytes) {
    if (bytes <= size_) return absl::OkStatus();
    if (data_ != nullptr) cudaFreeHost(data_);
    data_ = nullptr;
    size_ = 0;
    GC_CUDA_RETURN_IF_ERROR(cudaMallocHost(&data_, bytes));
    size_ = bytes;
    return absl::OkStatus();
  }

  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

// At least `bytes` in `buffer`; the contents are not kept. (cudaFree waits
// for the device, so work queued on the old block is done first.)
absl::Status Reserve(DeviceBuffer& buffer, size_t bytes) {
  if (bytes <= buffer.size()) return absl::OkStatus();
  buffer = DeviceBuffer();
  GC_ASSIGN_OR_RETURN(buffer, DeviceBuffer::Create(bytes));
  return absl::OkStatus();
}

// The memory of a selection, kept across calls and grown to the largest
// seen: a cudaMalloc, cudaFree or cudaMallocHost per call costs more than
// the selection itself. One per thread, so threads never share one.
struct Workspace {
  int device = -1;
  DeviceBuffer status;      // one SelectStatus
  DeviceBuffer sample;      // sampled keys
  DeviceBuffer radix;       // one RadixState
  DeviceBuffer candidates;  // indices a filter pass found
  DeviceBuffer trim;        // order, keys, kept
  DeviceBuffer temp;        // CUB scratch
  PinnedBuffer host;        // SelectStatus, then indices
  // The (n, k, sample, capacity) the buffers were last sized for: the same
  // again (a training step after the last) skips CUB's size queries.
  size_t sized_for[4] = {0, 0, 0, 0};
};

// This thread's workspace on the current device.
absl::StatusOr<Workspace*> ThreadWorkspace() {
  thread_local std::unique_ptr<Workspace> workspace;
  int device = 0;
  GC_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  if (workspace == nullptr || workspace->device != device) {
    workspace = std::make_unique<Workspace>();
    workspace->device = device;
    GC_RETURN_IF_ERROR(Reserve(workspace->status, sizeof(SelectStatus)));
    GC_RETURN_IF_ERROR(Reserve(workspace->radix, sizeof(RadixState)));
  }
  return workspace.get();
}

// The trim's device buffers for `capacity` candidates and k kept, carved
// from ws.trim: order first (8 bytes each; cudaMalloc aligns it), then keys
// (4 bytes each), then the kept indices.
struct TrimBuffers {
  uint64_t* order;
  uint32_t* keys;
  uint32_t* kept;
};

size_t TrimBytes(size_t capacity, size_t k) {
  return capacity * (sizeof(uint64_t) + sizeof(uint32_t)) +
         k * sizeof(uint32_t);
}

TrimBuffers CarveTrim(const Workspace& ws, size_t capacity) {
  TrimBuffers b;
  b.order = ws.trim.as<uint64_t>();
  b.keys = reinterpret_cast<uint32_t*>(b.order + capacity);
  b.kept = b.keys + capacity;
  return b;
}

// Room for a pass over n with `capacity` candidates and its trim to k, and
// for the sample, reserved while nothing is queued (growing
// frees the old blocks).
absl::Status ReserveForPass(Workspace& ws, const float* x, size_t n, size_t k,
                            const SelectPlan& plan, size_t capacity) {
  const size_t sizes[4] = {n, k, plan.sample, capacity};
  if (std::equal(sizes, sizes + 4, ws.sized_for)) return absl::OkStatus();
  GC_RETURN_IF_ERROR(Reserve(ws.candidates, capacity * sizeof(uint32_t)));
  GC_RETURN_IF_ERROR(Reserve(ws.trim, TrimBytes(capacity, k)));
  GC_RETURN_IF_ERROR(
      ws.host.Reserve(sizeof(SelectStatus) + k * sizeof(uint32_t)));
  if (plan.rank > 0) {
    GC_RETURN_IF_ERROR(Reserve(ws.sample, plan.sample * sizeof(uint32_t)));
  }
  SelectStatus* status = ws.status.as<SelectStatus>();
  size_t filter_bytes = 0;
  GC_CUDA_RETURN_IF_ERROR(
      SelectAtLeast(nullptr, filter_bytes, x, n, status, nullptr, 0, kStream));
  const TrimBuffers t = CarveTrim(ws, capacity);
  size_t trim_bytes = 0;
  GC_CUDA_RETURN_IF_ERROR(
      TrimToTopK(nullptr, trim_bytes, x, nullptr, capacity, k, t.keys, t.order,
                 ws.radix.as<RadixState>(), t.kept, status, kStream));
  GC_RETURN_IF_ERROR(Reserve(ws.temp, std::max(filter_bytes, trim_bytes)));
  std::copy(sizes, sizes + 4, ws.sized_for);
  return absl::OkStatus();
}

// Queues the sample (or every key, for an exact plan), the selection of its
// rank-th largest key, and that key as the first threshold into ws.status.
absl::Status QueueFirstThreshold(Workspace& ws, const float* x, size_t n,
                                 const SelectPlan& plan,
                                 const PhiloxStream& rng) {
  SelectStatus* status = ws.status.as<SelectStatus>();
  if (plan.rank == 0) {
    GC_CUDA_RETURN_IF_ERROR(
        LaunchSetThreshold(nullptr, kSmallestKey, status, kStream));
    return absl::OkStatus();
  }
  uint32_t* keys = ws.sample.as<uint32_t>();
  if (plan.exact) {
    GC_CUDA_RETURN_IF_ERROR(LaunchKeys(x, n, keys, kStream));
  } else {
    GC_CUDA_RETURN_IF_ERROR(LaunchStratifiedSample(
        x, n, plan.sample, ToPhiloxWords(rng), keys, kStream));
  }
  RadixState* radix = ws.radix.as<RadixState>();
  GC_CUDA_RETURN_IF_ERROR(
      LaunchRadixSelect(keys, plan.sample, plan.rank, radix, kStream));
  GC_CUDA_RETURN_IF_ERROR(
      LaunchSetThreshold(&radix->key, kSmallestKey, status, kStream));
  return absl::OkStatus();
}

// One filter pass at ws.status's threshold, the trim of what it found to k,
// and the copy of the status and the kept indices to ws.host; returns the
// status once they are there.
absl::StatusOr<SelectStatus> PassAndTrim(Workspace& ws, const float* x,
                                         size_t n, size_t k, size_t capacity) {
  SelectStatus* status = ws.status.as<SelectStatus>();
  const TrimBuffers t = CarveTrim(ws, capacity);
  size_t temp_bytes = ws.temp.size();
  GC_CUDA_RETURN_IF_ERROR(SelectAtLeast(ws.temp.data(), temp_bytes, x, n,
                                        status, ws.candidates.as<uint32_t>(),
                                        capacity, kStream));
  temp_bytes = ws.temp.size();
  GC_CUDA_RETURN_IF_ERROR(TrimToTopK(
      ws.temp.data(), temp_bytes, x, ws.candidates.as<uint32_t>(), capacity, k,
      t.keys, t.order, ws.radix.as<RadixState>(), t.kept, status, kStream));
  SelectStatus* host_status = ws.host.as<SelectStatus>();
  GC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_status, status,
                                          sizeof(SelectStatus),
                                          cudaMemcpyDeviceToHost, kStream));
  GC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_status + 1, t.kept,
                                          k * sizeof(uint32_t),
                                          cudaMemcpyDeviceToHost, kStream));
  GC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(kStream));
  return *host_status;
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
  GC_ASSIGN_OR_RETURN(Workspace * ws, ThreadWorkspace());
  const SelectPlan plan = PlanSelection(n, k, sample_fraction);
  result.sample_size = plan.sample;
  size_t capacity = InitialCapacity(n, k);
  GC_RETURN_IF_ERROR(ReserveForPass(*ws, x, n, k, plan, capacity));
  GC_RETURN_IF_ERROR(QueueFirstThreshold(*ws, x, n, plan, rng));
  SelectStatus pass;
  while (true) {
    GC_ASSIGN_OR_RETURN(pass, PassAndTrim(*ws, x, n, k, capacity));
    const size_t found = static_cast<size_t>(pass.found);
    if (found > capacity) {
      // Too many for the buffer: the same pass again, with room for all.
      capacity = found;
      GC_RETURN_IF_ERROR(ReserveForPass(*ws, x, n, k, plan, capacity));
      continue;
    }
    ++result.passes;
    if (!AnotherPass(plan, result.passes, pass.threshold, found, k)) break;
    GC_CUDA_RETURN_IF_ERROR(
        LaunchSetThreshold(nullptr, LowerThreshold(pass.threshold),
                           ws->status.as<SelectStatus>(), kStream));
  }
  result.threshold = FromMagnitudeKey(pass.threshold);
  const auto* kept =
      reinterpret_cast<const uint32_t*>(ws->host.as<SelectStatus>() + 1);
  result.indices.assign(kept, kept + pass.kept);
  return result;
}

}  // namespace gradcomp::codecs::cuda
