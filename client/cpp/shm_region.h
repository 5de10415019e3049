// A POSIX shared-memory region created by a client of gradcompd: create it,
// register it with RegisterSystemSharedMemory (Client::RegisterShm), point
// Reduce requests at slices of it, and release it. The region holds a
// shared flock on its object while it lives, which is how gradcompd tells
// that its creator is still there (it reclaims regions whose creator exited
// or was killed).
//
//   GC_ASSIGN_OR_RETURN(std::unique_ptr<ShmRegion> region,
//                       ShmRegion::Create(2 * n * sizeof(float), "job1"));
//   absl::Span<float> grads = region->floats();  // the client's view
//   GC_RETURN_IF_ERROR(client->RegisterShm("job1.rank0", region->key(), 0,
//                                          region->byte_size()));
#ifndef GRADCOMP_CLIENT_CPP_SHM_REGION_H_
#define GRADCOMP_CLIENT_CPP_SHM_REGION_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace gradcomp::client {

// The start of every name ShmRegion gives its objects unless told another:
// the default of gradcompd --shm_prefix, which maps only objects so named.
inline constexpr char kDefaultShmPrefix[] = "/gradcomp.";

class ShmRegion {
 public:
  // Creates and maps a new zero-filled object of `byte_size` bytes named
  // "<prefix><tag>.<pid>.<random>", so that jobs and pods sharing /dev/shm
  // never pick the same key. `tag` (e.g. the job) may hold letters, digits,
  // '-', '_' and '.'; `prefix` is the daemon's --shm_prefix: '/' and the
  // start of a name without another '/'. The object's pages are reserved
  // here: a /dev/shm too small for it (Docker's default is 64 MiB) is a
  // ResourceExhausted now rather than a SIGBUS on the first write. A size
  // of 0 or above the largest off_t is an InvalidArgument. `mode` is set as
  // given, whatever the umask: a gradcompd of another uid (its
  // --shm_owner_uids) opens the object read-write, so give it a group or
  // other read-write bit (0660 with a group both share, 0666 in a pod's
  // own /dev/shm); it must keep 0600 for the creator.
  static absl::StatusOr<std::unique_ptr<ShmRegion>> Create(
      uint64_t byte_size, absl::string_view tag = "region", mode_t mode = 0600,
      absl::string_view prefix = kDefaultShmPrefix);

  ShmRegion(const ShmRegion&) = delete;
  ShmRegion& operator=(const ShmRegion&) = delete;
  // Unmaps the region and, in the process that created it, unlinks its
  // object; a daemon that still has it mapped keeps its pages until it
  // unmaps them. A forked child that destroys its inherited copy unmaps and
  // closes only its own: the name and the parent's flock stay.
  ~ShmRegion();

  const std::string& key() const { return key_; }
  uint64_t byte_size() const { return bytes_.size(); }
  absl::Span<char> bytes() const { return bytes_; }
  // The region as float32 values (its size rounded down to whole floats).
  absl::Span<float> floats() const {
    return absl::Span<float>(reinterpret_cast<float*>(bytes_.data()),
                             bytes_.size() / sizeof(float));
  }

 private:
  ShmRegion(std::string key, int fd, absl::Span<char> bytes);

  const std::string key_;
  const pid_t creator_;  // the only process that unlinks key_
  const int fd_;
  const absl::Span<char> bytes_;
};

}  // namespace gradcomp::client

#endif  // GRADCOMP_CLIENT_CPP_SHM_REGION_H_
