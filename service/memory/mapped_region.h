// One mapping of a client-created POSIX shared-memory object (shm_open by
// key, never created here), read-write and shared, so the daemon reads a
// client's gradients and writes the average back without a copy over gRPC.
//
// The creator keeps the object's file open with a shared flock(2) for as
// long as the region is registered; when its last holder exits the kernel
// drops that lock, which is how the daemon notices a client that went away
// (CreatorAlive), even one killed with SIGKILL.
//
// The mapping is guarded against truncation (truncation_guard.h): a client
// that shrinks the object while the daemon uses it costs its own request
// and region, not the daemon.
//
//   GC_ASSIGN_OR_RETURN(std::unique_ptr<MappedRegion> region,
//                       MappedRegion::Map("/gradcomp.job.123.ab12", 0, size));
//   absl::Span<char> bytes = region->bytes();
#ifndef GRADCOMP_SERVICE_MEMORY_MAPPED_REGION_H_
#define GRADCOMP_SERVICE_MEMORY_MAPPED_REGION_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "service/memory/truncation_guard.h"

namespace gradcomp::service {

// InvalidArgument unless `key` is a POSIX shared-memory name: "/" then 1 to
// 254 characters, none of them '/', and not "." or "..".
absl::Status ValidateShmKey(const std::string& key);

class MappedRegion {
 public:
  // Opens the object `key`, checks that [offset, offset + byte_size) lies
  // within it (overflow-safe) and maps that range. NotFound if no such
  // object exists, InvalidArgument for a bad key or range, or a name that
  // is not a regular object (a FIFO, socket or device).
  static absl::StatusOr<std::unique_ptr<MappedRegion>> Map(
      const std::string& key, uint64_t offset, uint64_t byte_size);

  MappedRegion(const MappedRegion&) = delete;
  MappedRegion& operator=(const MappedRegion&) = delete;
  ~MappedRegion();

  // The registered range [offset, offset + byte_size) of the object.
  absl::Span<char> bytes() const { return bytes_; }
  uint64_t offset() const { return end_ - bytes_.size(); }

  // True if `other` maps some of the same bytes of the same object (by
  // device and inode, whatever names reach it): writing one changes the
  // other.
  bool Overlaps(const MappedRegion& other) const;
  const std::string& key() const { return key_; }

  // The uid that owns the object (fstat of the mapped descriptor, so the
  // object checked is the one mapped, whatever the name points at now).
  absl::StatusOr<uid_t> OwnerUid() const;

  // True while some process other than this daemon holds a flock on the
  // object: its creator is still there.
  absl::StatusOr<bool> CreatorAlive() const;

  // Removes the object's name if it still names the object mapped here
  // (same device and inode), so that the memory of a creator that died
  // without unlinking goes back once the mapping does. True if it removed
  // it; false if the name is gone or names another object now.
  absl::StatusOr<bool> UnlinkName() const;

  // FailedPrecondition if the object was truncated below the mapped range
  // since it was mapped (touching those pages would raise SIGBUS), or if
  // an access already faulted that way: from then on part of the mapping
  // reads zeros, so neither the request that used it nor any later one
  // may trust it.
  absl::Status CheckStillBacked() const;

 private:
  MappedRegion(std::string key, int fd, dev_t device, ino_t inode,
               void* map_base, size_t map_length, absl::Span<char> bytes,
               uint64_t end, std::unique_ptr<TruncationGuard> guard);

  const std::string key_;
  const int fd_;
  const dev_t device_;  // the object mapped, whatever its name names now
  const ino_t inode_;
  void* const map_base_;
  const size_t map_length_;
  const absl::Span<char> bytes_;
  const uint64_t end_;  // offset + byte_size within the object
  std::unique_ptr<TruncationGuard> guard_;  // reset before the munmap
};

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_MEMORY_MAPPED_REGION_H_
