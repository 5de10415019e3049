// Who may call the daemon's client API (gradcomp.v1.Gradcomp). Over a unix
// socket the socket file's permissions decide (see unix_socket.h); over TCP
// a call must carry `authorization: Bearer <token>` when a token is
// configured, and without one only loopback peers are served, unless
// unauthenticated TCP was asked for explicitly. The token is compared in
// constant time. No gRPC types here, so that the rules are unit-tested and
// fuzzed without a server.
//
//   GC_ASSIGN_OR_RETURN(ClientAuthOptions auth,
//                       ClientAuthFromFlags(token_file, allow_tcp));
//   GC_RETURN_IF_ERROR(CheckListenAddress(listen, auth));
//   ClientAuth checker(auth);
//   GC_RETURN_IF_ERROR(checker.Authorize(context.peer(), authorization));
#ifndef GRADCOMP_SERVICE_API_CLIENT_AUTH_H_
#define GRADCOMP_SERVICE_API_CLIENT_AUTH_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gradcomp::service {

// The metadata key a TCP client sends its token in, and the scheme before it.
inline constexpr char kAuthorizationKey[] = "authorization";
inline constexpr char kBearerPrefix[] = "Bearer ";

struct ClientAuthOptions {
  // Empty: no token; TCP calls are then served from loopback peers only.
  std::string token;
  // Serves TCP calls from any peer without a token (an explicit opt-out,
  // for networks where something else guards the port).
  bool allow_unauthenticated_tcp = false;
};

// The token in the file at `path`, without surrounding whitespace (a
// trailing newline is usual). InvalidArgument if it is empty or shorter
// than 16 bytes, NotFound if the file cannot be read.
absl::StatusOr<std::string> ReadClientToken(const std::string& path);

// `token_file` empty means no token.
absl::StatusOr<ClientAuthOptions> ClientAuthFromFlags(
    const std::string& token_file, bool allow_unauthenticated_tcp);

// True for "localhost", 127.0.0.0/8, ::1 and ::ffff:127.x.y.z (brackets
// allowed around IPv6).
bool IsLoopbackHost(absl::string_view host);

// Refuses, at start, a TCP listen address other than loopback when there is
// no token and unauthenticated TCP was not asked for: anyone on the network
// could then reduce, read state and set the policy. A unix socket passes.
absl::Status CheckListenAddress(absl::string_view listen,
                                const ClientAuthOptions& options);

// Equal contents and length, in a time that depends on the lengths only.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

class ClientAuth {
 public:
  explicit ClientAuth(ClientAuthOptions options);

  // Decides one call. `peer` is gRPC's peer URI ("unix:...", "ipv4:a.b.c.d:p",
  // "ipv6:[::1]:p"); `authorization` is the call's authorization metadata,
  // if any. OK, or Unauthenticated saying what was expected.
  absl::Status Authorize(absl::string_view peer,
                         std::optional<absl::string_view> authorization) const;

 private:
  const ClientAuthOptions options_;
};

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_API_CLIENT_AUTH_H_
