// CudaIpcRegion in a build without the CUDA toolkit: nothing can be opened.
#include "absl/strings/str_cat.h"
#include "service/memory/cuda_ipc_region.h"

namespace gradcomp::service {

absl::Status CudaIpcRegion::DeviceAvailable() {
  return absl::FailedPreconditionError(
      "this gradcompd has no usable CUDA device: it was built without the "
      "CUDA toolkit (GRADCOMP_NO_CUDA=1 or no nvcc); use system shared "
      "memory or inline tensors, or run a CUDA build on a GPU machine");
}

absl::StatusOr<std::unique_ptr<CudaIpcRegion>> CudaIpcRegion::Open(
    absl::string_view raw_handle, int device_id, uint64_t byte_size) {
  if (absl::Status valid =
          ValidateCudaIpcRequest(raw_handle, device_id, byte_size);
      !valid.ok()) {
    return valid;
  }
  return DeviceAvailable();
}

// No region is ever made in this build; these keep the class complete.
CudaIpcRegion::~CudaIpcRegion() = default;

absl::Status CudaIpcRegion::CopyToHost(uint64_t /*offset*/,
                                       absl::Span<char> /*out*/) const {
  return DeviceAvailable();
}

absl::Status CudaIpcRegion::CopyFromHost(uint64_t /*offset*/,
                                         absl::Span<const char> /*in*/) const {
  return DeviceAvailable();
}

}  // namespace gradcomp::service
