// The client API's unix socket: its directory is created if missing, and
// once gRPC has bound the socket its mode is set, so that the file's owner
// and group decide who may connect (connect(2) needs write permission).
//
//   GC_ASSIGN_OR_RETURN(mode_t mode, ParseSocketMode("0660"));
//   GC_RETURN_IF_ERROR(PrepareSocketDirectory(listen));
//   ... StartGrpcServer(listen, ...) ...
//   GC_RETURN_IF_ERROR(SetSocketMode(listen, mode));
#ifndef GRADCOMP_SERVICE_API_UNIX_SOCKET_H_
#define GRADCOMP_SERVICE_API_UNIX_SOCKET_H_

#include <sys/types.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gradcomp::service {

// The default: owner and group may connect, nobody else.
inline constexpr char kDefaultSocketMode[] = "0660";

// An octal permission string ("0660", "660", "0600") -> its mode bits.
// InvalidArgument for anything else, or for bits beyond 0777.
absl::StatusOr<mode_t> ParseSocketMode(absl::string_view text);

// For "unix:/a/b/c.sock", creates /a/b and any missing parent (mode 0755:
// the socket's own mode is the gate). Nothing to do for a TCP address.
absl::Status PrepareSocketDirectory(absl::string_view listen);

// Unavailable when a process accepts connections on the socket of
// "unix:/path" (gRPC would unlink it and bind its own, taking the socket
// from that process without an error); OK when there is no socket there,
// or one that nothing listens on (left by a process that is gone), which
// gRPC replaces. Nothing to do for a TCP address.
absl::Status RefuseSocketInUse(absl::string_view listen);

// chmod of the socket of "unix:/path" to `mode`; nothing for TCP.
absl::Status SetSocketMode(absl::string_view listen, mode_t mode);

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_API_UNIX_SOCKET_H_
