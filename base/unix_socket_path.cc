#include "base/unix_socket_path.h"

#include "absl/strings/match.h"
#include "absl/strings/strip.h"

namespace gradcomp {

std::optional<absl::string_view> UnixSocketPath(absl::string_view target) {
  // "unix://" then an absolute path: the empty authority of the URI form.
  if (absl::StartsWith(target, "unix:///")) {
    return target.substr(sizeof("unix://") - 1);
  }
  if (absl::ConsumePrefix(&target, "unix:")) return target;
  return std::nullopt;
}

}  // namespace gradcomp
