#include "base/file_bytes.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace gradcomp {

absl::StatusOr<std::string> ReadFileBytes(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(
        absl::StrCat("cannot open '", path, "': ", std::strerror(errno)));
  }
  absl::Cleanup close_fd = [fd] { close(fd); };
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    return absl::DataLossError(
        absl::StrCat("cannot stat '", path, "': ", std::strerror(errno)));
  }
  if (S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", path, "' is a directory, expected a file"));
  }
  std::string contents;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::DataLossError(
          absl::StrCat("error reading '", path, "': ", std::strerror(errno)));
    }
    contents.append(buffer, static_cast<size_t>(n));
  }
  return contents;
}

}  // namespace gradcomp
