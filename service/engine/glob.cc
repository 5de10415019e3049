#include "service/engine/glob.h"

#include <algorithm>
#include <cstddef>

#include "base/utf8.h"

namespace gradcomp::service {
namespace {

// Bytes of the UTF-8 character that starts at name[i] (1 for a byte that
// starts none), so that `?` and a `*` that grows take whole characters.
size_t CharBytes(absl::string_view name, size_t i) {
  return std::max<size_t>(Utf8SequenceBytes(name, i), 1);
}

}  // namespace

bool GlobMatch(absl::string_view pattern, absl::string_view name) {
  if (pattern.empty()) return true;
  // Greedy matching with one backtrack point (the last `*`): linear in
  // practice and never exponential, since a later `*` supersedes an earlier.
  size_t p = 0, n = 0;
  size_t star = absl::string_view::npos, star_n = 0;
  while (n < name.size()) {
    if (p < pattern.size() && pattern[p] == '?') {
      ++p;
      n += CharBytes(name, n);
    } else if (p < pattern.size() && pattern[p] == '*') {
      // Before the literal compare: a `*` in the name is a character like
      // any other, and the pattern's `*` still matches any run from here.
      star = p++;
      star_n = n;
    } else if (p < pattern.size() && pattern[p] == name[n]) {
      ++p;
      ++n;
    } else if (star != absl::string_view::npos) {
      p = star + 1;
      star_n += CharBytes(name, star_n);
      n = star_n;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

}  // namespace gradcomp::service
