#include "base/start_thread.h"

#include <system_error>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace gradcomp {

absl::StatusOr<std::thread> StartThread(std::function<void()> fn,
                                        absl::string_view what) {
  try {
    return std::thread(std::move(fn));
  } catch (const std::system_error& error) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot start a thread for ", what, ": ", error.what(),
                     "; expected fewer concurrent streams or requests, or a "
                     "higher thread limit (ulimit -u, memory)"));
  }
}

}  // namespace gradcomp
