// Keeps the daemon alive when a client truncates its shared-memory object
// while the daemon reads or writes the mapping: touching a page past the
// object's new end raises SIGBUS, which would end the daemon and every
// other client's work with it.
//
// A guarded mapping is looked up by the process's SIGBUS handler (installed
// with the first guard). A fault inside one replaces the rest of that
// mapping, from the faulting page on, with anonymous zero pages, marks the
// guard faulted and returns: the access completes (reads see zeros, writes
// go nowhere), and whoever owns the mapping must refuse the request that
// used it and the mapping from then on. A SIGBUS anywhere else keeps its
// default action.
//
//   GC_ASSIGN_OR_RETURN(std::unique_ptr<TruncationGuard> guard,
//                       TruncationGuard::Guard(base, length));
//   ... read and write [base, base + length) ...
//   if (guard->faulted()) return absl::FailedPreconditionError(...);
#ifndef GRADCOMP_SERVICE_MEMORY_TRUNCATION_GUARD_H_
#define GRADCOMP_SERVICE_MEMORY_TRUNCATION_GUARD_H_

#include <cstddef>
#include <memory>

#include "absl/status/statusor.h"

namespace gradcomp::service {

class TruncationGuard {
 public:
  // How many mappings may be guarded at once (a fixed table, because the
  // signal handler may not allocate or lock).
  static constexpr int kCapacity = 1 << 16;

  // Guards [base, base + length) until the guard is destroyed, which must
  // happen before the range is unmapped. ResourceExhausted when kCapacity
  // mappings are guarded already; Internal if the handler cannot be set.
  static absl::StatusOr<std::unique_ptr<TruncationGuard>> Guard(void* base,
                                                                size_t length);

  TruncationGuard(const TruncationGuard&) = delete;
  TruncationGuard& operator=(const TruncationGuard&) = delete;
  ~TruncationGuard();

  // True once an access to the range faulted: part of it now reads zeros
  // instead of the object's bytes, and writes to that part are lost.
  bool faulted() const;

 private:
  explicit TruncationGuard(int slot) : slot_(slot) {}

  const int slot_;
};

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_MEMORY_TRUNCATION_GUARD_H_
