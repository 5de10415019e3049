#include "base/bearer_token.h"

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"

namespace gradcomp {

absl::StatusOr<std::string> NormalizeBearerToken(absl::string_view raw) {
  const absl::string_view token = absl::StripAsciiWhitespace(raw);
  for (const char c : token) {
    const auto byte = static_cast<unsigned char>(c);
    if (!absl::ascii_isgraph(byte)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "holds byte 0x%02x; expected printable ASCII without spaces (the "
          "token travels as gRPC metadata)",
          byte));
    }
  }
  return std::string(token);
}

}  // namespace gradcomp
