// The GPU twins of the daemon's codecs, for tensors that are already in GPU
// memory (CUDA IPC slices): a DeviceCodec encodes straight from device memory
// and writes the average straight into it, so that only payload bytes cross
// to the host (docs/gpu.md, "Daemon on the GPU").
//
// One header, two implementations chosen by the build (service/engine/BUILD,
// HAS_CUDA): device_codecs_cuda.cc wraps codecs/cuda's CreateCudaCodec;
// device_codecs_none.cc, in CPU-only builds, has no twins, and the engine
// stages device tensors through the host as before.
//
//   DeviceCodecs twins;
//   if (std::shared_ptr<const DeviceCodec> twin = twins.Get(spec)) {
//     GC_RETURN_IF_ERROR(twin->Encode(device_id, d_grad, n, rows, state, ctx,
//     &p));
//     ...collective...
//     GC_RETURN_IF_ERROR(twin->Finish(device_id, result, ctx, d_out, n));
//   }
#ifndef GRADCOMP_SERVICE_ENGINE_DEVICE_CODECS_H_
#define GRADCOMP_SERVICE_ENGINE_DEVICE_CODECS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "codecs/codec.h"
#include "codecs/state.h"
#include "service/engine/policy.h"

namespace gradcomp::service {

// One codec's GPU operations. Pointers are device memory of `device_id`.
class DeviceCodec {
 public:
  virtual ~DeviceCodec() = default;

  // The payload of n fp32 values at `grad`, a tensor of `rows` rows
  // (shape[0]; 1 for a scalar): the CPU codec's bytes for the same input,
  // shape, state and context (codecs/cuda/cuda_codec.h).
  virtual absl::Status Encode(int device_id, const float* grad, size_t n,
                              int64_t rows, codecs::TensorState& state,
                              const codecs::StepContext& ctx,
                              codecs::Bytes* payload) const = 0;

  // Gives back what a successful Encode of `grad` (n values of `shape`)
  // into `payload` did to `state`, for a step that failed afterwards
  // (codecs::SingleRoundCodec::Revert, on the host, where the state is: the
  // gradient is copied there first). Where that copy fails the tensor's
  // state restarts from zero.
  virtual void Revert(int device_id, const float* grad, size_t n,
                      absl::Span<const int64_t> shape,
                      codecs::TensorState& state,
                      const codecs::StepContext& ctx,
                      absl::string_view payload) const = 0;

  // Writes the average of a round's result to `out` (n values), with the
  // CPU codec's arithmetic: a summed round's FinishSum (on the host, over
  // the collective's host sum) copied to the device; a gathered round's
  // payloads each decoded on the GPU with weight 1/W (a majority vote is
  // finished on the host). A bad payload is an InvalidArgument naming its
  // rank and leaves `out` untouched. Returns once `out` is written.
  virtual absl::Status Finish(int device_id, const codecs::RoundResult& result,
                              const codecs::StepContext& ctx, float* out,
                              size_t n) const = 0;
};

// Copies between a device and the host (for the staged path of codecs
// without a twin, and for tests). Unavailable in a CPU-only build.
absl::Status CopyDeviceToHost(int device_id, const void* device,
                              absl::Span<char> host);
absl::Status CopyHostToDevice(int device_id, absl::Span<const char> host,
                              void* device);

// How many of the n fp32 values at `values` (device memory) are NaN or Inf,
// counted on the device. Unavailable in a CPU-only build.
absl::StatusOr<uint64_t> CountNonfiniteOnDevice(int device_id,
                                                const float* values, size_t n);

// The twin of `spec`: Unavailable without a usable GPU (always, in a
// CPU-only build); NotFound or InvalidArgument when codecs/cuda has no twin
// for the codec's name or parameters.
absl::StatusOr<std::unique_ptr<DeviceCodec>> CreateDeviceCodec(
    const CodecSpec& spec);

// GetInfo's device: the name of CUDA device 0 when this daemon has a usable
// GPU (it then reduces CUDA tensors there), else "cpu". Asked once.
std::string ComputeDevice();

// GPU twins by codec spec, created once and shared. Thread-safe.
class DeviceCodecs {
 public:
  // The twin of `spec`, or null when this daemon has no usable GPU or the
  // codec has none (its name or its parameters): then the caller stages the
  // tensor through the host and runs the CPU codec. Each codec name without
  // a twin, and the absence of a GPU, are said once on stderr.
  std::shared_ptr<const DeviceCodec> Get(const CodecSpec& spec)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Mutex mu_;
  std::map<std::pair<std::string, std::map<std::string, std::string>>,
           std::shared_ptr<const DeviceCodec>>
      twins_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> said_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_ENGINE_DEVICE_CODECS_H_
