#include "service/engine/glob.h"

#include <cstddef>

namespace gradcomp::service {

bool GlobMatch(absl::string_view pattern, absl::string_view name) {
  if (pattern.empty()) return true;
  // Greedy matching with one backtrack point (the last `*`): linear in
  // practice and never exponential, since a later `*` supersedes an earlier.
  size_t p = 0, n = 0;
  size_t star = absl::string_view::npos, star_n = 0;
  while (n < name.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == name[n])) {
      ++p;
      ++n;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      star_n = n;
    } else if (star != absl::string_view::npos) {
      p = star + 1;
      n = ++star_n;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

}  // namespace gradcomp::service
