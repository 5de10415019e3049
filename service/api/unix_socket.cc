#include "service/api/unix_socket.h"

#include <errno.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <optional>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/unix_socket_path.h"

namespace gradcomp::service {
absl::StatusOr<mode_t> ParseSocketMode(absl::string_view text) {
  if (text.empty() || text.size() > 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("socket mode '", text,
                     "' is not an octal permission, expected e.g. 0660"));
  }
  mode_t mode = 0;
  for (const char c : text) {
    if (c < '0' || c > '7') {
      return absl::InvalidArgumentError(
          absl::StrCat("socket mode '", text,
                       "' is not an octal permission, expected e.g. 0660"));
    }
    mode = mode * 8 + static_cast<mode_t>(c - '0');
  }
  if (mode > 0777) {
    return absl::InvalidArgumentError(
        absl::StrCat("socket mode '", text,
                     "' sets bits beyond 0777, expected permissions only"));
  }
  return mode;
}

absl::Status PrepareSocketDirectory(absl::string_view listen) {
  const std::optional<absl::string_view> unix_path = UnixSocketPath(listen);
  if (!unix_path.has_value()) return absl::OkStatus();
  const std::string path(*unix_path);
  // Every prefix ending before a '/' is a directory to have.
  for (size_t slash = path.find('/', 1); slash != std::string::npos;
       slash = path.find('/', slash + 1)) {
    const std::string dir = path.substr(0, slash);
    if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
      return absl::PermissionDeniedError(absl::StrCat(
          "cannot create directory '", dir, "' for the client socket '", path,
          "': ", std::strerror(errno),
          "; expected a writable place (run as a user who may create it, or "
          "pass --listen=unix:/a/writable/dir/gradcomp.sock)"));
    }
  }
  return absl::OkStatus();
}

absl::Status RefuseSocketInUse(absl::string_view listen) {
  const std::optional<absl::string_view> unix_path = UnixSocketPath(listen);
  if (!unix_path.has_value()) return absl::OkStatus();
  const std::string path(*unix_path);
  struct stat st;
  sockaddr_un addr{};
  if (lstat(path.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode) ||
      path.size() >= sizeof(addr.sun_path)) {
    return absl::OkStatus();  // nothing to take over; bind reports the rest
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return absl::InternalError(
        absl::StrCat("cannot check whether the client socket '", path,
                     "' is in use: socket: ", std::strerror(errno)));
  }
  const int connected =
      connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  const int error = errno;
  close(fd);
  if (connected != 0 && (error == ECONNREFUSED || error == ENOENT)) {
    return absl::OkStatus();  // stale: its process is gone
  }
  if (connected == 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot serve gRPC on '", listen,
        "': another process listens on it (another gradcompd?); stop it, or "
        "give this daemon another --listen"));
  }
  return absl::UnavailableError(absl::StrCat(
      "cannot serve gRPC on '", listen, "': cannot tell whether the socket ",
      "is in use (connect: ", std::strerror(error),
      "); remove it if no process serves it"));
}

absl::Status SetSocketMode(absl::string_view listen, mode_t mode) {
  const std::optional<absl::string_view> unix_path = UnixSocketPath(listen);
  if (!unix_path.has_value()) return absl::OkStatus();
  const std::string path(*unix_path);
  if (chmod(path.c_str(), mode) != 0) {
    return absl::InternalError(
        absl::StrFormat("cannot set mode %04o on the client socket '%s': %s",
                        mode, path, std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace gradcomp::service
