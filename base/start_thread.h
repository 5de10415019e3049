// Starting a thread without letting std::thread's std::system_error escape:
// when the system has no thread to give (EAGAIN: a process or user limit,
// or no address space for its stack) the caller gets ResourceExhausted and
// decides what to refuse, instead of the daemon ending in std::terminate.
//
//   GC_ASSIGN_OR_RETURN(std::thread writer,
//                       StartThread([this] { WriteAll(); }, "a writer"));
#ifndef GRADCOMP_BASE_START_THREAD_H_
#define GRADCOMP_BASE_START_THREAD_H_

#include <functional>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gradcomp {

// `fn` running on a new thread, or ResourceExhausted naming `what` and the
// system's reason.
absl::StatusOr<std::thread> StartThread(std::function<void()> fn,
                                        absl::string_view what);

}  // namespace gradcomp

#endif  // GRADCOMP_BASE_START_THREAD_H_
