// Shell-style name patterns for policy rules: `*` matches any run of
// characters (dots included), `?` exactly one (a whole UTF-8 character),
// everything else itself. No character classes: ValidatePolicy refuses a
// pattern with `[`.
//
//   GlobMatch("*.weight", "layer1.conv.weight");  // true
//   GlobMatch("fc?.bias", "fc1.bias");            // true
#ifndef GRADCOMP_SERVICE_ENGINE_GLOB_H_
#define GRADCOMP_SERVICE_ENGINE_GLOB_H_

#include "absl/strings/string_view.h"

namespace gradcomp::service {

// Whether `name` matches `pattern` as a whole. An empty pattern matches
// every name, like "*", so that an unset rule field means "any".
bool GlobMatch(absl::string_view pattern, absl::string_view name);

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_ENGINE_GLOB_H_
