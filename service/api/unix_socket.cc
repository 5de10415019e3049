#include "service/api/unix_socket.h"

#include <errno.h>
#include <sys/stat.h>

#include <cstring>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace gradcomp::service {
namespace {

constexpr absl::string_view kUnixScheme = "unix:";

}  // namespace

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
  if (!absl::StartsWith(listen, kUnixScheme)) return absl::OkStatus();
  const std::string path(listen.substr(kUnixScheme.size()));
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

absl::Status SetSocketMode(absl::string_view listen, mode_t mode) {
  if (!absl::StartsWith(listen, kUnixScheme)) return absl::OkStatus();
  const std::string path(listen.substr(kUnixScheme.size()));
  if (chmod(path.c_str(), mode) != 0) {
    return absl::InternalError(
        absl::StrFormat("cannot set mode %04o on the client socket '%s': %s",
                        mode, path, std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace gradcomp::service
