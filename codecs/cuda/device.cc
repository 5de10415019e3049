#include "codecs/cuda/device.h"

#include <utility>

#include "absl/strings/str_format.h"

namespace gradcomp::codecs::cuda {

absl::Status CudaStatus(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return absl::OkStatus();
  const std::string message =
      absl::StrFormat("CUDA: %s failed: %s (%s)", what,
                      cudaGetErrorString(error), cudaGetErrorName(error));
  switch (error) {
    case cudaErrorInsufficientDriver:
    case cudaErrorNoDevice:
    case cudaErrorInvalidDevice:
    case cudaErrorDevicesUnavailable:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::Status CudaDeviceAvailable() {
  static const absl::Status* const status = [] {
    int count = 0;
    const cudaError_t error = cudaGetDeviceCount(&count);
    if (error != cudaSuccess) {
      return new absl::Status(absl::UnavailableError(absl::StrFormat(
          "no usable CUDA device: cudaGetDeviceCount failed: %s (%s); "
          "expected a GPU and its driver",
          cudaGetErrorString(error), cudaGetErrorName(error))));
    }
    if (count < 1) {
      return new absl::Status(absl::UnavailableError(
          "no usable CUDA device: cudaGetDeviceCount found 0 devices"));
    }
    return new absl::Status(absl::OkStatus());
  }();
  return *status;
}

absl::Status SynchronizeStream(cudaStream_t stream) {
  return CudaStatus(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

absl::Status CopyToDevice(absl::Span<const float> host, float* device) {
  if (host.empty()) return absl::OkStatus();
  GC_CUDA_RETURN_IF_ERROR(cudaMemcpy(device, host.data(),
                                     host.size() * sizeof(float),
                                     cudaMemcpyHostToDevice));
  return absl::OkStatus();
}

absl::Status CopyToHost(const float* device, absl::Span<float> host) {
  if (host.empty()) return absl::OkStatus();
  GC_CUDA_RETURN_IF_ERROR(cudaMemcpy(host.data(), device,
                                     host.size() * sizeof(float),
                                     cudaMemcpyDeviceToHost));
  return absl::OkStatus();
}

absl::StatusOr<DeviceBuffer> DeviceBuffer::Create(size_t bytes) {
  DeviceBuffer buffer;
  if (bytes == 0) return buffer;
  const cudaError_t error = cudaMalloc(&buffer.data_, bytes);
  if (error != cudaSuccess) {
    buffer.data_ = nullptr;
    return CudaStatus(error,
                      absl::StrFormat("cudaMalloc(%d bytes)", bytes).c_str());
  }
  buffer.size_ = bytes;
  return buffer;
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) cudaFree(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (data_ != nullptr) cudaFree(data_);
}

}  // namespace gradcomp::codecs::cuda
