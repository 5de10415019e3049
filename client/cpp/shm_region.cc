#include "client/cpp/shm_region.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace gradcomp::client {
namespace {

absl::Status ErrnoError(absl::string_view what, const std::string& key) {
  return absl::InternalError(absl::StrCat(what, " of shared memory '", key,
                                          "': ", std::strerror(errno)));
}

bool IsKeyChar(char c) {
  return absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.';
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShmRegion>> ShmRegion::Create(
    uint64_t byte_size, absl::string_view tag) {
  if (byte_size == 0) {
    return absl::InvalidArgumentError(
        "shared-memory region of 0 bytes, expected a positive size");
  }
  if (tag.empty() || tag.size() > 128 ||
      !std::all_of(tag.begin(), tag.end(), IsKeyChar)) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared-memory tag '", tag,
                     "': expected 1 to 128 letters, digits, '-', '_' or '.'"));
  }
  std::random_device random;
  const std::string key = absl::StrFormat("/gradcomp.%s.%d.%08x%08x", tag,
                                          getpid(), random(), random());
  const int fd =
      shm_open(key.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoError("shm_open", key);
  absl::Status status;
  void* base = MAP_FAILED;
  if (ftruncate(fd, static_cast<off_t>(byte_size)) != 0) {
    status = ErrnoError("ftruncate", key);
  } else if (flock(fd, LOCK_SH) != 0) {
    status = ErrnoError("flock", key);
  } else {
    base = mmap(nullptr, byte_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) status = ErrnoError("mmap", key);
  }
  if (!status.ok()) {
    close(fd);
    shm_unlink(key.c_str());
    return status;
  }
  return std::unique_ptr<ShmRegion>(new ShmRegion(
      key, fd, absl::Span<char>(static_cast<char*>(base), byte_size)));
}

ShmRegion::ShmRegion(std::string key, int fd, absl::Span<char> bytes)
    : key_(std::move(key)), fd_(fd), bytes_(bytes) {}

ShmRegion::~ShmRegion() {
  munmap(bytes_.data(), bytes_.size());
  shm_unlink(key_.c_str());
  close(fd_);  // drops the flock: gradcompd may reclaim the registration
}

}  // namespace gradcomp::client
