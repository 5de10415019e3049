// Device memory that a registered shared-memory region names: what the
// registry and its slices need of a CUDA IPC region (cuda_ipc_region.h),
// as an interface so that the registry's ownership, in-flight and reclaim
// rules are tested without a GPU (a test supplies its own opener through
// SharedMemoryOptions::device_region_opener).
//
//   absl::StatusOr<std::unique_ptr<DeviceRegion>> region =
//       CudaIpcRegion::Open(handle, /*device_id=*/0, size);
#ifndef GRADCOMP_SERVICE_MEMORY_DEVICE_REGION_H_
#define GRADCOMP_SERVICE_MEMORY_DEVICE_REGION_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace gradcomp::service {

class DeviceRegion {
 public:
  virtual ~DeviceRegion() = default;  // releases the device memory's handle

  virtual uint64_t byte_size() const = 0;
  virtual int device_id() const = 0;
  // The device address of byte `offset`; the caller has bounds-checked it.
  virtual void* device_address(uint64_t offset) const = 0;
  // Copies [offset, offset + out.size()) to `out` / `in` to the region,
  // synchronously; InvalidArgument for a range past byte_size().
  virtual absl::Status CopyToHost(uint64_t offset,
                                  absl::Span<char> out) const = 0;
  virtual absl::Status CopyFromHost(uint64_t offset,
                                    absl::Span<const char> in) const = 0;
};

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_MEMORY_DEVICE_REGION_H_
