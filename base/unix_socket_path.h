// The path of a gRPC unix-socket target, and how long one may be. gRPC
// takes "unix:relative/or/absolute" and "unix:///absolute" (the URI form);
// the daemon's listen address and the C++ client's target both go through
// here, so that both read a target the way gRPC does.
//
//   if (std::optional<absl::string_view> path = UnixSocketPath(target);
//       path.has_value() && path->size() > kMaxUnixSocketPathBytes) ...
#ifndef GRADCOMP_BASE_UNIX_SOCKET_PATH_H_
#define GRADCOMP_BASE_UNIX_SOCKET_PATH_H_

#include <cstddef>
#include <optional>

#include "absl/strings/string_view.h"

namespace gradcomp {

// sockaddr_un.sun_path holds 108 bytes on Linux, the terminating NUL
// included: a longer path cannot be bound or connected to.
inline constexpr size_t kMaxUnixSocketPathBytes = 107;

// The socket path of "unix:///abs" (the URI form: "/abs") or "unix:path";
// nullopt for any other target (host:port, dns:, unix-abstract:). The path
// may be empty ("unix:"), which the caller refuses.
std::optional<absl::string_view> UnixSocketPath(absl::string_view target);

}  // namespace gradcomp

#endif  // GRADCOMP_BASE_UNIX_SOCKET_PATH_H_
