// The daemon's registry of client shared-memory regions (system shared
// memory, POSIX shm, and CUDA IPC device memory): registered by name, owned by
// the client that registered them, handed to requests as reference-counted
// slices, and reclaimed once their creator process is gone.
//
// Names are unique within a daemon: a second client asking for a name in
// use gets AlreadyExists naming the owner, never the other client's memory.
// A slice is bounds-checked without overflow. Unregister refuses a region
// that a request is using (FailedPrecondition with the in-flight count); a
// reclaimed region leaves the map at once but stays mapped until its last
// slice is released, so nothing is unmapped under a request.
//
//   SharedMemoryRegistry shm(SharedMemoryOptions(), &metrics);
//   GC_RETURN_IF_ERROR(shm.RegisterSystem("client-1", "grads",
//                                         "/gradcomp.job.1234.0f3a", 0, n));
//   GC_ASSIGN_OR_RETURN(SharedMemorySlice in,
//                       shm.Acquire("client-1", "grads", 0, 4096));
//   absl::Span<char> bytes = in.bytes();  // valid while `in` lives
#ifndef GRADCOMP_SERVICE_MEMORY_SHARED_MEMORY_REGISTRY_H_
#define GRADCOMP_SERVICE_MEMORY_SHARED_MEMORY_REGISTRY_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/call_once.h"
#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "service/memory/cuda_ipc_region.h"
#include "service/memory/device_region.h"
#include "service/memory/mapped_region.h"
#include "service/metrics/metrics.h"

namespace gradcomp::service {

// The prefix of the objects gradcomp's helpers create ("/gradcomp.<tag>.
// <pid>.<random>", client/python/gradcomp/shm.py, client/cpp/shm_region.h).
inline constexpr char kDefaultShmPrefix[] = "/gradcomp.";

// Opens RegisterCuda's handle as device memory: CudaIpcRegion::Open in the
// daemon; tests without a GPU supply their own.
using DeviceRegionOpener =
    std::function<absl::StatusOr<std::unique_ptr<DeviceRegion>>(
        absl::string_view raw_handle, int device_id, uint64_t byte_size)>;

struct SharedMemoryOptions {
  // The only POSIX shared-memory objects a client may register: names that
  // start with this, so that a client cannot map the daemon's or another
  // program's objects in /dev/shm. Empty: any name.
  std::string key_prefix = kDefaultShmPrefix;
  // Besides the daemon's own uid, the uids whose objects may be mapped.
  // The daemon cannot learn a caller's uid (gRPC 1.51 does not expose a
  // unix socket's peer credentials), so an object of any other owner is
  // refused: a client cannot make the daemon map another user's memory.
  std::vector<uid_t> owner_uids;
  // How often regions whose creator is gone are looked for; zero: never in
  // the background (call ReclaimAbandoned yourself).
  absl::Duration reclaim_interval = absl::Seconds(1);
  // Opens CUDA regions. A FailedPrecondition from it means "no usable CUDA
  // device": logged and counted once.
  DeviceRegionOpener device_region_opener = CudaIpcRegion::Open;
  // The most regions registered at once. Each holds a file descriptor and
  // a mapping, so a client that registers without end would take the
  // descriptors the daemon's connections need, or the mappings its heap and
  // threads need. 0: DefaultMaxShmRegions().
  size_t max_regions = 0;
};

// Half of the process's open-file limit (RLIMIT_NOFILE) or a quarter of
// vm.max_map_count, the smaller, at least 64: MaxShmRegionsFor of this
// process's figures (an unknown one, or an unlimited open-file limit, is
// left out; 2^16 if both are).
size_t DefaultMaxShmRegions();
size_t MaxShmRegionsFor(std::optional<uint64_t> open_files,
                        std::optional<uint64_t> max_map_count);

struct SharedMemoryRegionInfo {
  std::string name;
  std::string kind;  // "system" or "cuda"
  uint64_t byte_size = 0;
  std::string key;
  int in_flight = 0;     // slices held by requests right now
  std::string lock_key;  // a CUDA region's liveness lock, or empty
};

// A registered region and its request count, shared by the registry and the
// slices that use it.
struct SharedMemoryRegion {
  std::string name;
  std::string owner;
  // Exactly one of these: a system region's mapping or a CUDA region.
  std::unique_ptr<MappedRegion> mapping;
  std::unique_ptr<DeviceRegion> cuda;
  // A CUDA region's liveness lock (RegisterCuda's lock_key), or null: the
  // region is reclaimed once nobody holds a flock on it.
  std::unique_ptr<MappedRegion> lock;
  std::atomic<int> in_flight{0};

  uint64_t byte_size() const {
    return cuda != nullptr ? cuda->byte_size() : mapping->bytes().size();
  }
};

// One request's use of a region: the region stays mapped, and counted as in
// flight, until this is destroyed.
class SharedMemorySlice {
 public:
  // [offset, offset + bytes.size()) of a region: `bytes` is host memory
  // for a system region; for a CUDA region only its offset and size count.
  SharedMemorySlice(std::shared_ptr<SharedMemoryRegion> region,
                    absl::Span<char> bytes, uint64_t offset);
  SharedMemorySlice(SharedMemorySlice&& other) noexcept;
  SharedMemorySlice& operator=(SharedMemorySlice&&) = delete;
  SharedMemorySlice(const SharedMemorySlice&) = delete;
  ~SharedMemorySlice();

  // A system slice's bytes. Empty for a slice of a CUDA region, whose
  // bytes live on a GPU: use CopyToHost / CopyFromHost.
  absl::Span<char> bytes() const {
    return on_device() ? absl::Span<char>() : bytes_;
  }
  bool on_device() const { return region_->cuda != nullptr; }
  uint64_t byte_size() const { return bytes_.size(); }
  // A CUDA slice's first byte on its device, and the device; null and -1
  // for a system slice.
  void* device_data() const {
    return on_device() ? region_->cuda->device_address(offset_) : nullptr;
  }
  int device_id() const {
    return on_device() ? region_->cuda->device_id() : -1;
  }

  // A system slice: FailedPrecondition if its object was truncated below
  // the region, now or while in use (then what lay past the new end read
  // as zeros and writes there were lost: the request that used the slice
  // must fail). Always OK for a CUDA slice.
  absl::Status CheckStillBacked() const;

  // A CUDA slice's bytes to `out` (byte_size() bytes) / from `in`.
  absl::Status CopyToHost(absl::Span<char> out) const;
  absl::Status CopyFromHost(absl::Span<const char> in) const;

 private:
  std::shared_ptr<SharedMemoryRegion> region_;
  absl::Span<char> bytes_;
  uint64_t offset_;
};

class SharedMemoryRegistry {
 public:
  // `metrics` must outlive the registry.
  SharedMemoryRegistry(const SharedMemoryOptions& options, Metrics* metrics);
  ~SharedMemoryRegistry();

  // Maps [offset, offset + byte_size) of the POSIX object `key` as region
  // `name` of `client`. PermissionDenied, naming the prefix, unless `key`
  // starts with the options' key_prefix; PermissionDenied, naming both
  // uids, unless the object is owned by the daemon's uid or one of the
  // options' owner_uids. The creator must hold a shared
  // flock on the object (the gradcomp helpers do), else FailedPrecondition:
  // without it the region could never be reclaimed.
  absl::Status RegisterSystem(absl::string_view client, absl::string_view name,
                              const std::string& key, uint64_t offset,
                              uint64_t byte_size) ABSL_LOCKS_EXCLUDED(mu_);

  // Opens the CUDA IPC handle `raw_handle` (device memory another process
  // exported) on `device_id` as region `name` of `client`, with the same
  // name, ownership, bounds and in-flight rules as RegisterSystem.
  // InvalidArgument for a malformed or refused handle; FailedPrecondition
  // "this gradcompd has no usable CUDA device: ..." in a CPU-only build or
  // without a GPU, which is logged and counted
  // (gradcomp_gpu_unavailable_total) the first time only.
  //
  // `lock_key`, when not empty, names a POSIX shm object (at least 1 byte,
  // under the key prefix, of an allowed uid, like RegisterSystem's key) on
  // which the client holds a shared flock for as long as the region should
  // live: ReclaimAbandoned drops the region once nobody holds it. A lock
  // that is missing, refused or not locked is an error and nothing is
  // opened. Without a lock_key the region lives until unregistered.
  absl::Status RegisterCuda(absl::string_view client, absl::string_view name,
                            absl::string_view raw_handle, int device_id,
                            uint64_t byte_size, const std::string& lock_key)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Unregisters `name`, or every region of `client` when `name` is empty
  // (all or none: nothing is unregistered if one of them is in use).
  absl::Status Unregister(absl::string_view client, absl::string_view name)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The regions of `client`: all of them, or the one named (NotFound if it
  // is not one of the client's).
  absl::StatusOr<std::vector<SharedMemoryRegionInfo>> Status(
      absl::string_view client, absl::string_view name) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // [offset, offset + byte_size) of region `name`, held until the returned
  // slice is destroyed.
  absl::StatusOr<SharedMemorySlice> Acquire(absl::string_view client,
                                            absl::string_view name,
                                            uint64_t offset, uint64_t byte_size)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Drops every region whose creator no longer holds its flock (the client
  // exited or was killed): system regions' objects and CUDA regions' lock
  // objects; returns how many. Counted in
  // gradcomp_shm_regions_reclaimed_total. A dropped region stays mapped
  // (its IPC handle open) until its last in-flight slice is released.
  int ReclaimAbandoned() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  using Regions =
      absl::btree_map<std::string, std::shared_ptr<SharedMemoryRegion>>;

  // ResourceExhausted for registering `name` when max_regions are
  // registered (counted).
  absl::Status FullError(absl::string_view name) const;
  // InvalidArgument for an empty name, AlreadyExists for a name in use,
  // ResourceExhausted when the registry is full.
  absl::Status CheckNewName(absl::string_view client,
                            absl::string_view name) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Maps [offset, offset + byte_size) of `key` (request field `field`)
  // after the prefix check, and checks its owner uid and that some process
  // holds a flock on it (`held_for` says why it must).
  absl::StatusOr<std::unique_ptr<MappedRegion>> MapHeldObject(
      absl::string_view field, const std::string& key, uint64_t offset,
      uint64_t byte_size, absl::string_view held_for) const;
  // Adds `region`; AlreadyExists if its name was taken meanwhile.
  absl::Status Insert(std::shared_ptr<SharedMemoryRegion> region)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Looks `name` up for `client`: NotFound or PermissionDenied otherwise.
  absl::StatusOr<std::shared_ptr<SharedMemoryRegion>> FindLocked(
      absl::string_view client, absl::string_view name) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void PublishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReclaimLoop(absl::Duration interval);

  Metrics* const metrics_;
  const std::string key_prefix_;
  const std::vector<uid_t> owner_uids_;
  const DeviceRegionOpener device_region_opener_;
  mutable absl::Mutex mu_;
  const size_t max_regions_;
  Regions regions_ ABSL_GUARDED_BY(mu_);
  absl::once_flag gpu_unavailable_once_;
  absl::Notification stop_;
  std::thread reclaimer_;
};

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_MEMORY_SHARED_MEMORY_REGISTRY_H_
