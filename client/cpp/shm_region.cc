#include "client/cpp/shm_region.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <limits>
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

// Where shm_open(3) puts objects on Linux.
constexpr char kShmDir[] = "/dev/shm";

// Takes the object's pages now. ftruncate alone reserves nothing on tmpfs:
// pages are taken on first write, and a write that finds /dev/shm full
// raises SIGBUS. A full /dev/shm is a ResourceExhausted that says how much
// room it has, as that is what the caller must raise (docker run
// --shm-size, a larger memory emptyDir).
absl::Status ReservePages(int fd, uint64_t byte_size, const std::string& key) {
  // posix_fallocate returns its error; it does not set errno. A signal can
  // interrupt a large reservation on tmpfs (EINTR): it starts again, as
  // Python's os.posix_fallocate does.
  int error = 0;
  do {
    error = posix_fallocate(fd, 0, static_cast<off_t>(byte_size));
  } while (error == EINTR);
  if (error == 0) return absl::OkStatus();
  if (error != ENOSPC) {
    return absl::InternalError(absl::StrCat("posix_fallocate of ", byte_size,
                                            " bytes of shared memory '", key,
                                            "': ", std::strerror(error)));
  }
  std::string room;
  struct statvfs fs;
  if (statvfs(kShmDir, &fs) == 0) {
    room = absl::StrCat(" (", kShmDir, " has ",
                        uint64_t{fs.f_bavail} * fs.f_frsize, " bytes free of ",
                        uint64_t{fs.f_blocks} * fs.f_frsize, ")");
  }
  return absl::ResourceExhaustedError(
      absl::StrCat("shared memory '", key, "': no room for ", byte_size,
                   " bytes in ", kShmDir, room,
                   "; give it more (e.g. docker run --shm-size) or use a "
                   "smaller region"));
}

// The longest prefix: a key is '/' and at most NAME_MAX (255) bytes, of
// which the tag (at most 128), a pid (at most 10 digits), the 16 random
// hex digits and the two dots take 156.
constexpr size_t kMaxPrefix = 1 + 255 - 156;

bool IsKeyChar(char c) {
  return absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.';
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShmRegion>> ShmRegion::Create(
    uint64_t byte_size, absl::string_view tag, mode_t mode,
    absl::string_view prefix) {
  // ftruncate and mmap take the size as an off_t: a larger one would come
  // back as an EINVAL that does not say which argument was wrong.
  constexpr uint64_t kMaxSize = std::numeric_limits<off_t>::max();
  if (byte_size == 0 || byte_size > kMaxSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared-memory region of ", byte_size,
                     " bytes, expected a positive size of at most ", kMaxSize));
  }
  if (tag.empty() || tag.size() > 128 ||
      !std::all_of(tag.begin(), tag.end(), IsKeyChar)) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared-memory tag '", tag,
                     "': expected 1 to 128 letters, digits, '-', '_' or '.'"));
  }
  if ((mode & ~mode_t{0777}) != 0 || (mode & 0600) != 0600) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "shared-memory mode %#o: expected permission bits (at most 0777) that "
        "let the owner read and write (0600 at least)",
        mode));
  }
  // As gradcompd checks its --shm_prefix. The name after the '/' must fit
  // NAME_MAX with the tag, the pid and the random part.
  if (prefix.size() < 2 || prefix.size() > kMaxPrefix || prefix[0] != '/' ||
      prefix.find('/', 1) != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shared-memory prefix '", prefix, "': expected '/' and the start of a ",
        "name without another '/', at most ", kMaxPrefix,
        " bytes (gradcompd --shm_prefix; default '", kDefaultShmPrefix, "')"));
  }
  std::random_device random;
  const std::string key = absl::StrFormat("%s%s.%d.%08x%08x", prefix, tag,
                                          getpid(), random(), random());
  const int fd =
      shm_open(key.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoError("shm_open", key);
  absl::Status status;
  void* base = MAP_FAILED;
  if (fchmod(fd, mode) != 0) status = ErrnoError("fchmod", key);
  if (status.ok() && ftruncate(fd, static_cast<off_t>(byte_size)) != 0) {
    status = ErrnoError("ftruncate", key);
  }
  if (status.ok()) status = ReservePages(fd, byte_size, key);
  if (status.ok() && flock(fd, LOCK_SH) != 0) status = ErrnoError("flock", key);
  if (status.ok()) {
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
    : key_(std::move(key)), creator_(getpid()), fd_(fd), bytes_(bytes) {}

ShmRegion::~ShmRegion() {
  munmap(bytes_.data(), bytes_.size());
  // A forked child's copy must not take the name from under its parent,
  // which still uses (and has registered) the region.
  if (getpid() == creator_) shm_unlink(key_.c_str());
  close(fd_);  // drops the flock: gradcompd may reclaim the registration
}

}  // namespace gradcomp::client
