// CudaIpcRegion with the CUDA runtime (linked only in CUDA builds).
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "codecs/cuda/device.h"
#include "service/memory/cuda_ipc_region.h"

namespace gradcomp::service {
namespace {

// `what` failed with `error`, as InvalidArgument: the request named
// something CUDA refuses (a stale or foreign handle, a bad device).
absl::Status Refused(cudaError_t error, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat(what, " failed: ", cudaGetErrorString(error), " (",
                   cudaGetErrorName(error), ")"));
}

// The size of the allocation that starts at `base`, from the driver's
// cuMemGetAddressRange (through the runtime's entry-point lookup, so that
// nothing links libcuda directly).
absl::StatusOr<size_t> AllocationSize(void* base) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found;
  const cudaError_t error = cudaGetDriverEntryPointByVersion(
      "cuMemGetAddressRange", &fn, 12000, cudaEnableDefault, &found);
  if (error != cudaSuccess || found != cudaDriverEntryPointSuccess ||
      fn == nullptr) {
    return absl::InternalError(
        "CUDA: cannot look up the driver's cuMemGetAddressRange to check "
        "the region's size");
  }
  CUdeviceptr start = 0;
  size_t size = 0;
  const CUresult result = reinterpret_cast<PFN_cuMemGetAddressRange_v3020>(fn)(
      &start, &size, reinterpret_cast<CUdeviceptr>(base));
  if (result != CUDA_SUCCESS) {
    return absl::InternalError(
        absl::StrCat("CUDA: cuMemGetAddressRange failed with error ",
                     static_cast<int>(result)));
  }
  return size - (reinterpret_cast<CUdeviceptr>(base) - start);
}

}  // namespace

absl::Status CudaIpcRegion::DeviceAvailable() {
  const absl::Status available = codecs::cuda::CudaDeviceAvailable();
  if (available.ok()) return available;
  return absl::FailedPreconditionError(absl::StrCat(
      "this gradcompd has no usable CUDA device: ", available.message()));
}

absl::StatusOr<std::unique_ptr<CudaIpcRegion>> CudaIpcRegion::Open(
    absl::string_view raw_handle, int device_id, uint64_t byte_size) {
  if (absl::Status valid =
          ValidateCudaIpcRequest(raw_handle, device_id, byte_size);
      !valid.ok()) {
    return valid;
  }
  if (absl::Status available = DeviceAvailable(); !available.ok()) {
    return available;
  }
  int count = 0;
  if (cudaError_t error = cudaGetDeviceCount(&count); error != cudaSuccess) {
    return Refused(error, "cudaGetDeviceCount");
  }
  if (device_id >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("device_id ", device_id,
                     " does not exist: this daemon "
                     "sees ",
                     count, " CUDA device(s), expected 0..", count - 1,
                     " (CUDA_VISIBLE_DEVICES of the daemon and the client "
                     "must number devices alike)"));
  }
  if (cudaError_t error = cudaSetDevice(device_id); error != cudaSuccess) {
    return Refused(error, absl::StrCat("cudaSetDevice(", device_id, ")"));
  }
  cudaIpcMemHandle_t handle;
  static_assert(sizeof(handle) == kCudaIpcHandleBytes);
  std::memcpy(&handle, raw_handle.data(), sizeof(handle));
  void* base = nullptr;
  if (cudaError_t error =
          cudaIpcOpenMemHandle(&base, handle, cudaIpcMemLazyEnablePeerAccess);
      error != cudaSuccess) {
    return Refused(error,
                   "cudaIpcOpenMemHandle (expected a handle from "
                   "cudaIpcGetMemHandle in another, live process)");
  }
  std::unique_ptr<CudaIpcRegion> region(
      new CudaIpcRegion(base, device_id, byte_size));
  absl::StatusOr<size_t> allocated = AllocationSize(base);
  if (!allocated.ok()) return allocated.status();
  if (byte_size > *allocated) {
    return absl::InvalidArgumentError(absl::StrCat(
        "byte_size ", byte_size, " is larger than the exported allocation (",
        *allocated, " bytes), expected at most ", *allocated));
  }
  return region;
}

CudaIpcRegion::~CudaIpcRegion() {
  cudaSetDevice(device_id_);
  cudaIpcCloseMemHandle(base_);
}

absl::Status CudaIpcRegion::CopyToHost(uint64_t offset,
                                       absl::Span<char> out) const {
  if (absl::Status range = CheckRange(offset, out.size()); !range.ok()) {
    return range;
  }
  GC_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_id_));
  GC_CUDA_RETURN_IF_ERROR(cudaMemcpy(out.data(),
                                     static_cast<char*>(base_) + offset,
                                     out.size(), cudaMemcpyDeviceToHost));
  return absl::OkStatus();
}

absl::Status CudaIpcRegion::CopyFromHost(uint64_t offset,
                                         absl::Span<const char> in) const {
  if (absl::Status range = CheckRange(offset, in.size()); !range.ok()) {
    return range;
  }
  GC_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_id_));
  GC_CUDA_RETURN_IF_ERROR(cudaMemcpy(static_cast<char*>(base_) + offset,
                                     in.data(), in.size(),
                                     cudaMemcpyHostToDevice));
  // From pageable memory cudaMemcpy may return once the bytes are staged,
  // before the DMA lands; the client reads the output as soon as we answer.
  return codecs::cuda::SynchronizeStream();
}

}  // namespace gradcomp::service
