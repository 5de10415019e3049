// CUDA plumbing for the GPU codecs: one macro that turns a CUDA error into an
// absl::Status carrying the CUDA error string, device memory that frees
// itself, and the question every caller asks first: is there a usable GPU?
//
//   GC_RETURN_IF_ERROR(CudaDeviceAvailable());  // Unavailable without a GPU
//   GC_ASSIGN_OR_RETURN(DeviceBuffer buf, DeviceBuffer::Create(bytes));
//   GC_CUDA_RETURN_IF_ERROR(cudaMemcpy(buf.data(), host, bytes,
//                                      cudaMemcpyHostToDevice));
#ifndef GRADCOMP_CODECS_CUDA_DEVICE_H_
#define GRADCOMP_CODECS_CUDA_DEVICE_H_

#include <cuda_runtime_api.h>

#include <cstddef>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "base/status_macros.h"

namespace gradcomp::codecs::cuda {

// OK for cudaSuccess; otherwise Internal (Unavailable for the errors that
// mean "no usable GPU or driver") naming `what` and the CUDA error string.
absl::Status CudaStatus(cudaError_t error, const char* what);

#define GC_CUDA_RETURN_IF_ERROR(expr) \
  GC_RETURN_IF_ERROR(::gradcomp::codecs::cuda::CudaStatus((expr), #expr))

// OK when cudaGetDeviceCount finds at least one device. Otherwise
// Unavailable with the CUDA runtime's reason (on a machine without a driver:
// cudaErrorInsufficientDriver or cudaErrorNoDevice). Asked once per process.
absl::Status CudaDeviceAvailable();

// Waits for the work queued so far on `stream` (null: the default stream)
// of the current device. A call that hands device memory back to a client
// ends with it: a device-to-device cudaMemcpy, and the DMA of a
// host-to-device one from pageable memory, may still run when the call
// returns. Unlike cudaDeviceSynchronize it does not wait for the device's
// other streams, which serve other clients.
absl::Status SynchronizeStream(cudaStream_t stream = nullptr);

// Copies host.size() floats from host memory to `device` / from `device`
// to host memory (cudaMemcpy: synchronous for pageable host memory); an
// empty span copies nothing.
absl::Status CopyToDevice(absl::Span<const float> host, float* device);
absl::Status CopyToHost(const float* device, absl::Span<float> host);

// A cudaMalloc'd block, freed on destruction. Move-only.
class DeviceBuffer {
 public:
  // Zero bytes gives an empty buffer (data() == nullptr) without a call.
  static absl::StatusOr<DeviceBuffer> Create(size_t bytes);

  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  void* data() const { return data_; }
  size_t size() const { return size_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace gradcomp::codecs::cuda

#endif  // GRADCOMP_CODECS_CUDA_DEVICE_H_
