#include "service/memory/cuda_ipc_region.h"

#include "absl/strings/str_cat.h"

namespace gradcomp::service {

absl::Status ValidateCudaIpcRequest(absl::string_view raw_handle, int device_id,
                                    uint64_t byte_size) {
  if (raw_handle.size() != kCudaIpcHandleBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "raw_handle has ", raw_handle.size(), " bytes, expected the ",
        kCudaIpcHandleBytes,
        " bytes of a cudaIpcMemHandle_t (cudaIpcGetMemHandle, or torch's "
        "untyped_storage()._share_cuda_())"));
  }
  if (device_id < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("device_id ", device_id,
                     " is negative, expected the CUDA device ordinal (>= 0) "
                     "the buffer lives on"));
  }
  if (byte_size == 0) {
    return absl::InvalidArgumentError(
        "byte_size is 0, expected the size in bytes of the exported buffer");
  }
  return absl::OkStatus();
}

absl::Status CudaIpcRegion::CheckRange(uint64_t offset, uint64_t size) const {
  if (offset > byte_size_ || size > byte_size_ - offset) {
    return absl::InvalidArgumentError(
        absl::StrCat("range offset ", offset, " byte_size ", size,
                     " ends past the CUDA region's ", byte_size_,
                     " bytes, expected offset + byte_size <= ", byte_size_));
  }
  return absl::OkStatus();
}

}  // namespace gradcomp::service
