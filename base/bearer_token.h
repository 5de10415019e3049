// The client token's text rules, one place for the daemon (its
// --client_token_file) and the C++ client (ClientOptions::token or
// $GRADCOMP_TOKEN). The token travels as gRPC metadata
// `authorization: Bearer <token>`, and gRPC aborts the process on a
// metadata value it cannot send, so a bad byte is refused before.
//
//   GC_ASSIGN_OR_RETURN(std::string token, NormalizeBearerToken(raw));
#ifndef GRADCOMP_BASE_BEARER_TOKEN_H_
#define GRADCOMP_BASE_BEARER_TOKEN_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gradcomp {

// `raw` without its surrounding ASCII whitespace (a secret file's trailing
// newline), or InvalidArgument naming the first byte that is not printable
// ASCII without spaces ('!'..'~'). The caller adds where the token came
// from; an empty result means no token.
absl::StatusOr<std::string> NormalizeBearerToken(absl::string_view raw);

}  // namespace gradcomp

#endif  // GRADCOMP_BASE_BEARER_TOKEN_H_
