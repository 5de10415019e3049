#include "service/api/client_auth.h"

#include <arpa/inet.h>

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "base/bearer_token.h"
#include "base/file_bytes.h"

namespace gradcomp::service {
namespace {

// Shorter tokens are guessable; 16 bytes of base64 or hex are not.
constexpr size_t kMinTokenBytes = 16;

// "host:port" -> "host", with IPv6 brackets removed; "" if there is no port.
std::string HostOf(absl::string_view address) {
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos) return "";
  absl::string_view host = address.substr(0, colon);
  if (absl::ConsumePrefix(&host, "[")) absl::ConsumeSuffix(&host, "]");
  return std::string(host);
}

}  // namespace

absl::StatusOr<std::string> ReadClientToken(const std::string& path) {
  absl::StatusOr<std::string> bytes = ReadFileBytes(path);
  if (!bytes.ok()) {
    return absl::Status(
        bytes.status().code(),
        absl::StrCat("client token file: ", bytes.status().message(),
                     "; expected a readable file holding the token"));
  }
  absl::StatusOr<std::string> token = NormalizeBearerToken(*bytes);
  if (!token.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "client token file '", path, "' ", token.status().message()));
  }
  if (token->size() < kMinTokenBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "client token file '", path, "' holds ", token->size(),
        " bytes after trimming whitespace, expected a token of at least ",
        kMinTokenBytes, " (e.g. `head -c 32 /dev/urandom | base64`)"));
  }
  return token;
}

absl::StatusOr<ClientAuthOptions> ClientAuthFromFlags(
    const std::string& token_file, bool allow_unauthenticated_tcp) {
  ClientAuthOptions options;
  options.allow_unauthenticated_tcp = allow_unauthenticated_tcp;
  if (!token_file.empty()) {
    absl::StatusOr<std::string> token = ReadClientToken(token_file);
    if (!token.ok()) return token.status();
    options.token = std::move(*token);
  }
  return options;
}

bool IsLoopbackHost(absl::string_view host) {
  if (absl::ConsumePrefix(&host, "[")) {
    if (!absl::ConsumeSuffix(&host, "]")) return false;
  }
  if (absl::EqualsIgnoreCase(host, "localhost")) return true;
  const std::string text(host);
  in_addr v4;
  if (inet_pton(AF_INET, text.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6;
  if (inet_pton(AF_INET6, text.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
  }
  return false;
}

absl::Status CheckListenAddress(absl::string_view listen,
                                const ClientAuthOptions& options) {
  if (absl::StartsWith(listen, "unix:")) return absl::OkStatus();
  if (!options.token.empty() || options.allow_unauthenticated_tcp) {
    return absl::OkStatus();
  }
  if (IsLoopbackHost(HostOf(listen))) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "listen is '", listen,
      "', a TCP address beyond loopback, and no client token is set: anyone "
      "who reaches it could reduce, read state and change the policy. "
      "Expected a unix:/path socket (the default), a loopback address, "
      "--client_token_file=<file> (clients then send 'authorization: Bearer "
      "<token>'), or --allow_unauthenticated_tcp if something else guards "
      "the port"));
}

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  // Every byte of the longer string is read whatever the contents, so the
  // time says nothing about how long a matching prefix is.
  const size_t n = a.size() > b.size() ? a.size() : b.size();
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? a[i] : 0;
    const unsigned char y = i < b.size() ? b[i] : 0;
    diff |= x ^ y;
  }
  return diff == 0;
}

ClientAuth::ClientAuth(ClientAuthOptions options)
    : options_(std::move(options)) {}

absl::Status ClientAuth::Authorize(
    absl::string_view peer,
    std::optional<absl::string_view> authorization) const {
  // The socket file's permissions already decided who could connect.
  if (absl::StartsWith(peer, "unix:")) return absl::OkStatus();
  if (options_.token.empty()) {
    if (options_.allow_unauthenticated_tcp) return absl::OkStatus();
    // gRPC writes IPv6 peers as "ipv6:[::1]:port", percent-encoded or not.
    absl::string_view address = peer;
    const bool ip = absl::ConsumePrefix(&address, "ipv4:") ||
                    absl::ConsumePrefix(&address, "ipv6:");
    const std::string decoded = absl::StrReplaceAll(
        address, {{"%5B", "["}, {"%5D", "]"}, {"%5b", "["}, {"%5d", "]"}});
    if (ip && IsLoopbackHost(HostOf(decoded))) return absl::OkStatus();
    return absl::UnauthenticatedError(absl::StrCat(
        "calls from '", peer,
        "' are refused: without a client token this daemon serves TCP "
        "clients on loopback only; expected the unix socket or a loopback "
        "connection"));
  }
  if (!authorization.has_value()) {
    return absl::UnauthenticatedError(
        "no 'authorization' metadata: this daemon expects 'authorization: "
        "Bearer <token>' on TCP (set the client's token option or "
        "GRADCOMP_TOKEN)");
  }
  absl::string_view presented = *authorization;
  if (!absl::ConsumePrefix(&presented, kBearerPrefix)) {
    return absl::UnauthenticatedError(
        "the 'authorization' metadata is not 'Bearer <token>'");
  }
  if (!ConstantTimeEquals(presented, options_.token)) {
    return absl::UnauthenticatedError(
        "the bearer token does not match this daemon's client token");
  }
  return absl::OkStatus();
}

}  // namespace gradcomp::service
