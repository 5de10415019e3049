#include "service/memory/mapped_region.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace gradcomp::service {
namespace {

std::string Errno(int error) { return std::strerror(error); }

absl::StatusOr<struct stat> Stat(int fd, const std::string& key) {
  struct stat st;
  if (fstat(fd, &st) != 0) {
    return absl::InternalError(
        absl::StrCat("fstat of shared memory '", key, "': ", Errno(errno)));
  }
  return st;
}

absl::StatusOr<uint64_t> ObjectSize(int fd, const std::string& key) {
  absl::StatusOr<struct stat> st = Stat(fd, key);
  if (!st.ok()) return st.status();
  return static_cast<uint64_t>(st->st_size);
}

}  // namespace

absl::Status ValidateShmKey(const std::string& key) {
  const std::string body = key.empty() ? "" : key.substr(1);
  if (key.empty() || key[0] != '/' || body.empty() || body.size() > 254 ||
      body.find('/') != std::string::npos || body == "." || body == "..") {
    return absl::InvalidArgumentError(
        absl::StrCat("shm_key '", key,
                     "' is not a POSIX shared-memory name, expected '/' then "
                     "1 to 254 characters without '/' (e.g. "
                     "'/gradcomp.job.1234.0f3a')"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<MappedRegion>> MappedRegion::Map(
    const std::string& key, uint64_t offset, uint64_t byte_size) {
  if (absl::Status status = ValidateShmKey(key); !status.ok()) return status;
  if (byte_size == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("byte_size of shared memory '", key,
                     "' is 0, expected the number of bytes to register"));
  }
  const int fd = shm_open(key.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) {
    const int error = errno;
    const std::string message =
        absl::StrCat("cannot open shared memory '", key, "': ", Errno(error));
    if (error == ENOENT) {
      return absl::NotFoundError(absl::StrCat(
          message,
          "; expected an object the client created with shm_open "
          "(is /dev/shm shared between the client and gradcompd?)"));
    }
    if (error == EACCES) {
      const uid_t uid = geteuid();
      return absl::PermissionDeniedError(absl::StrCat(
          message, "; this daemon runs as uid ", uid,
          " and opens it read-write: expected an object whose mode lets uid ",
          uid,
          " read and write it (gradcomp's helpers: mode=0o666 or "
          "Client(shm_mode=...)), or a client of uid ",
          uid));
    }
    // Out of descriptors is a shortage to retry later, not a bad request.
    if (error == EMFILE || error == ENFILE) {
      return absl::ResourceExhaustedError(message);
    }
    return absl::InvalidArgumentError(message);
  }
  absl::StatusOr<struct stat> st = Stat(fd, key);
  if (st.ok() && !S_ISREG(st->st_mode)) {
    st = absl::InvalidArgumentError(
        absl::StrCat("'", key,
                     "' is not a shared-memory object (a FIFO, socket or "
                     "device has that name), expected one the client created "
                     "with shm_open"));
  }
  absl::StatusOr<uint64_t> size =
      st.ok() ? absl::StatusOr<uint64_t>(st->st_size) : st.status();
  if (size.ok() && (offset > *size || byte_size > *size - offset)) {
    size = absl::InvalidArgumentError(absl::StrCat(
        "shared memory '", key, "' holds ", *size, " bytes; offset ", offset,
        " + byte_size ", byte_size, " does not fit in it"));
  }
  if (!size.ok()) {
    close(fd);
    return size.status();
  }
  // mmap wants a page-aligned offset: map from the page that holds
  // `offset` and hand out the registered range inside it.
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t aligned = offset - offset % page;
  const size_t length = static_cast<size_t>(byte_size + (offset - aligned));
  void* base = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                    static_cast<off_t>(aligned));
  if (base == MAP_FAILED) {
    const int error = errno;
    close(fd);
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot map ", byte_size, " bytes of shared memory '", key,
                     "' at offset ", offset, ": ", Errno(error)));
  }
  absl::StatusOr<std::unique_ptr<TruncationGuard>> guard =
      TruncationGuard::Guard(base, length);
  if (!guard.ok()) {
    munmap(base, length);
    close(fd);
    return guard.status();
  }
  absl::Span<char> bytes(static_cast<char*>(base) + (offset - aligned),
                         static_cast<size_t>(byte_size));
  return std::unique_ptr<MappedRegion>(
      new MappedRegion(key, fd, st->st_dev, st->st_ino, base, length, bytes,
                       offset + byte_size, *std::move(guard)));
}

MappedRegion::MappedRegion(std::string key, int fd, dev_t device, ino_t inode,
                           void* map_base, size_t map_length,
                           absl::Span<char> bytes, uint64_t end,
                           std::unique_ptr<TruncationGuard> guard)
    : key_(std::move(key)),
      fd_(fd),
      device_(device),
      inode_(inode),
      map_base_(map_base),
      map_length_(map_length),
      bytes_(bytes),
      end_(end),
      guard_(std::move(guard)) {}

MappedRegion::~MappedRegion() {
  // Unguarded before unmapping: a later mapping at these addresses must not
  // be found under this one's slot.
  guard_.reset();
  munmap(map_base_, map_length_);
  close(fd_);
}

absl::StatusOr<uid_t> MappedRegion::OwnerUid() const {
  struct stat st;
  if (fstat(fd_, &st) != 0) {
    return absl::InternalError(
        absl::StrCat("fstat of shared memory '", key_, "': ", Errno(errno)));
  }
  return st.st_uid;
}

absl::StatusOr<bool> MappedRegion::CreatorAlive() const {
  // A shared lock held by anyone else makes an exclusive try fail; once it
  // succeeds nobody holds one, and it is released at once.
  if (flock(fd_, LOCK_EX | LOCK_NB) == 0) {
    flock(fd_, LOCK_UN);
    return false;
  }
  if (errno == EWOULDBLOCK) return true;
  return absl::InternalError(
      absl::StrCat("flock of shared memory '", key_, "': ", Errno(errno)));
}

bool MappedRegion::Overlaps(const MappedRegion& other) const {
  return device_ == other.device_ && inode_ == other.inode_ &&
         offset() < other.end_ && other.offset() < end_;
}

absl::StatusOr<bool> MappedRegion::UnlinkName() const {
  // Non-blocking: a client may have put a FIFO under the name, and an
  // open for reading would wait for its writer.
  const int named =
      shm_open(key_.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK, 0);
  if (named < 0) {
    if (errno == ENOENT) return false;
    return absl::InternalError(absl::StrCat("cannot open shared memory '", key_,
                                            "' to unlink it: ", Errno(errno)));
  }
  struct stat now;
  const bool same =
      fstat(named, &now) == 0 && now.st_dev == device_ && now.st_ino == inode_;
  close(named);
  if (!same) return false;
  if (shm_unlink(key_.c_str()) != 0) {
    if (errno == ENOENT) return false;
    return absl::InternalError(absl::StrCat("cannot unlink shared memory '",
                                            key_, "': ", Errno(errno)));
  }
  return true;
}

absl::Status MappedRegion::CheckStillBacked() const {
  if (guard_->faulted()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shared memory '", key_,
        "' was truncated while the daemon was using it (what lay past its new "
        "end read as zeros and was not written); unregister it and register "
        "it again"));
  }
  absl::StatusOr<uint64_t> size = ObjectSize(fd_, key_);
  if (!size.ok()) return size.status();
  if (*size < end_) {
    return absl::FailedPreconditionError(
        absl::StrCat("shared memory '", key_, "' was truncated to ", *size,
                     " bytes, below the ", end_,
                     " it was registered with; register it again"));
  }
  return absl::OkStatus();
}

}  // namespace gradcomp::service
