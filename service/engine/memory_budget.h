// The daemon's memory budget: bytes that in-flight requests (their payloads,
// working copies and results) and the codecs' per-tensor state may hold
// together. A request reserves its bytes before it allocates them; when the
// budget is full it waits a bounded time for others to release theirs, then
// fails with ResourceExhausted naming what it asked for, what is in use and
// the budget. Reservations are RAII: whatever path a request leaves by, its
// bytes come back.
//
//   MemoryBudget budget(uint64_t{8} << 30, &metrics);
//   GC_ASSIGN_OR_RETURN(MemoryBudget::Reservation r,
//                       budget.Reserve(bytes, "tensor 'w'", absl::Seconds(5)));
//   ...  // allocate and use up to `bytes`; ~Reservation gives them back
#ifndef GRADCOMP_SERVICE_ENGINE_MEMORY_BUDGET_H_
#define GRADCOMP_SERVICE_ENGINE_MEMORY_BUDGET_H_

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "service/metrics/metrics.h"

namespace gradcomp::service {

class MemoryBudget {
 public:
  // Bytes held for one request until it is destroyed or released. Movable;
  // a default-constructed one holds nothing and belongs to no budget.
  class Reservation {
   public:
    Reservation() = default;
    Reservation(Reservation&& other) noexcept;
    Reservation& operator=(Reservation&& other) noexcept;
    Reservation(const Reservation&) = delete;
    Reservation& operator=(const Reservation&) = delete;
    ~Reservation() { Release(); }

    // Grows this reservation to `bytes` in all (nothing happens when it
    // already holds as many), waiting up to `wait` as Reserve does; on
    // failure it keeps what it held. FailedPrecondition if it belongs to no
    // budget.
    absl::Status GrowTo(uint64_t bytes, absl::string_view what,
                        absl::Duration wait);
    // Gives back what it holds beyond `bytes` (nothing when it holds no
    // more): a request whose working copies are freed but whose result
    // still waits.
    void ShrinkTo(uint64_t bytes);
    // Gives the bytes back now.
    void Release();
    uint64_t bytes() const { return bytes_; }

   private:
    friend class MemoryBudget;
    Reservation(MemoryBudget* budget, uint64_t bytes)
        : budget_(budget), bytes_(bytes) {}

    MemoryBudget* budget_ = nullptr;
    uint64_t bytes_ = 0;
  };

  // `total` > 0 bytes. `metrics` (may be null) gets the bytes in use and
  // the refusals (resource "memory"); it must outlive the budget.
  MemoryBudget(uint64_t total, Metrics* metrics);
  MemoryBudget(const MemoryBudget&) = delete;
  MemoryBudget& operator=(const MemoryBudget&) = delete;

  // Reserves `bytes` for `what` (named in the error), waiting up to `wait`
  // while the budget is full. ResourceExhausted at once when `bytes` alone
  // exceed the budget, else after the wait.
  absl::StatusOr<Reservation> Reserve(uint64_t bytes, absl::string_view what,
                                      absl::Duration wait)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Codec state that persists between requests grew (delta > 0) or shrank:
  // it counts against the budget at once, without waiting, since it is
  // already allocated; requests then find that much less room.
  void AddState(int64_t delta) ABSL_LOCKS_EXCLUDED(mu_);
  // AddState for state not allocated yet (an import): a growth that does
  // not fit in the budget now is ResourceExhausted for `what`, adding
  // nothing.
  absl::Status AddStateIfRoom(int64_t delta, absl::string_view what)
      ABSL_LOCKS_EXCLUDED(mu_);

  uint64_t total() const { return total_; }
  // Reserved by requests plus held by codec state.
  uint64_t in_use() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t state_bytes() const ABSL_LOCKS_EXCLUDED(mu_);
  // Reserve calls waiting for room now.
  int waiting() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Adds `bytes` to the requests' share, waiting up to `wait` for room.
  absl::Status Acquire(uint64_t bytes, absl::string_view what,
                       absl::Duration wait) ABSL_LOCKS_EXCLUDED(mu_);
  void Give(uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // `bytes` more fit beside what is reserved and held now.
  bool FitsLocked(uint64_t bytes) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PublishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint64_t total_;
  Metrics* const metrics_;
  mutable absl::Mutex mu_;
  uint64_t reserved_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t state_ ABSL_GUARDED_BY(mu_) = 0;
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;
};

// Half of the memory this process may use: the smaller of the machine's
// physical memory and the cgroup's limit (v2 memory.max or v1
// memory.limit_in_bytes) when there is one. The daemon's default budget.
uint64_t DefaultMemoryBudgetBytes();

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_ENGINE_MEMORY_BUDGET_H_
