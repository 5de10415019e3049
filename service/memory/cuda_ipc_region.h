// Device memory that a client process exported with cudaIpcGetMemHandle,
// opened in the daemon (cudaIpcOpenMemHandle) so that a Reduce can name a
// slice of a client's GPU buffer. CUDA IPC handles open only in another
// process than the one that made them.
//
// One header, two implementations chosen by the build (service/memory/BUILD,
// HAS_CUDA): cuda_ipc_region_cuda.cc with the toolkit, cuda_ipc_region_none.cc
// without it, where every Open is FailedPrecondition "this gradcompd has no
// usable CUDA device: ...". The same message comes from a CUDA build on a
// machine whose driver or device does not answer.
//
//   GC_ASSIGN_OR_RETURN(std::unique_ptr<CudaIpcRegion> region,
//                       CudaIpcRegion::Open(handle, /*device_id=*/0, size));
//   GC_RETURN_IF_ERROR(region->CopyToHost(offset, host_span));
#ifndef GRADCOMP_SERVICE_MEMORY_CUDA_IPC_REGION_H_
#define GRADCOMP_SERVICE_MEMORY_CUDA_IPC_REGION_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "service/memory/device_region.h"

namespace gradcomp::service {

// sizeof(cudaIpcMemHandle_t): the bytes of RegisterCudaSharedMemory's
// raw_handle.
inline constexpr size_t kCudaIpcHandleBytes = 64;

// InvalidArgument, saying what was expected, unless raw_handle has
// kCudaIpcHandleBytes bytes, device_id >= 0 and byte_size > 0. Checked
// before any GPU is asked for, in both builds.
absl::Status ValidateCudaIpcRequest(absl::string_view raw_handle, int device_id,
                                    uint64_t byte_size);

class CudaIpcRegion : public DeviceRegion {
 public:
  // OK when this build has CUDA and a device answers; otherwise
  // FailedPrecondition "this gradcompd has no usable CUDA device: <why>".
  // Asked once per process.
  static absl::Status DeviceAvailable();

  // Opens the handle on device `device_id` as a region of `byte_size` bytes
  // from the start of the exported allocation. InvalidArgument for a
  // malformed request (ValidateCudaIpcRequest), a device that does not
  // exist, a handle CUDA refuses, or byte_size past the allocation's end;
  // FailedPrecondition without a usable GPU.
  static absl::StatusOr<std::unique_ptr<CudaIpcRegion>> Open(
      absl::string_view raw_handle, int device_id, uint64_t byte_size);

  CudaIpcRegion(const CudaIpcRegion&) = delete;
  CudaIpcRegion& operator=(const CudaIpcRegion&) = delete;
  ~CudaIpcRegion() override;  // cudaIpcCloseMemHandle

  uint64_t byte_size() const override { return byte_size_; }
  int device_id() const override { return device_id_; }
  // The device address of byte `offset` of the region, for kernels that
  // read or write it in place; the caller has bounds-checked the range
  // (SharedMemoryRegistry::Acquire does).
  void* device_address(uint64_t offset) const override {
    return static_cast<char*>(base_) + offset;
  }

  // Copies [offset, offset + out.size()) of the region to `out` / `in` to
  // it, synchronously. InvalidArgument if the range ends past byte_size()
  // (overflow-safe); the CUDA error otherwise.
  absl::Status CopyToHost(uint64_t offset, absl::Span<char> out) const override;
  absl::Status CopyFromHost(uint64_t offset,
                            absl::Span<const char> in) const override;

 private:
  CudaIpcRegion(void* base, int device_id, uint64_t byte_size)
      : base_(base), device_id_(device_id), byte_size_(byte_size) {}

  // InvalidArgument unless [offset, offset + size) lies within byte_size_.
  absl::Status CheckRange(uint64_t offset, uint64_t size) const;

  void* const base_;
  const int device_id_;
  const uint64_t byte_size_;
};

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_MEMORY_CUDA_IPC_REGION_H_
