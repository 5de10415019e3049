// Cancels what has been stuck too long: a ReduceStream whose client stopped
// reading (alive, but not taking its answers) keeps its writer in one Write
// for ever, and the answers queued behind it hold their share of the memory
// budget; enough such streams lock every other client out. The same holds
// for a state stream whose client stops sending or taking pieces. One
// thread looks at every watched stream a few times per timeout and calls
// the cancel of those whose current wait began more than `timeout` ago.
// Times are of the steady clock: a step of the wall clock cancels nothing.
//
//   StallWatchdog watchdog(absl::Minutes(2));
//   GC_ASSIGN_OR_RETURN(
//       StallWatchdog::Watched watched,
//       watchdog.Watch([&] { return outbox.WritingSince(); },
//                      [&] { context->TryCancel(); }));
//   // ... until `watched` is destroyed, before what its functions use.
#ifndef GRADCOMP_SERVICE_API_STALL_WATCHDOG_H_
#define GRADCOMP_SERVICE_API_STALL_WATCHDOG_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace gradcomp::service {

class StallWatchdog {
 public:
  using Clock = std::chrono::steady_clock;
  // When the watched thing's current wait began; nullopt while it is not
  // waiting.
  using SinceFn = std::function<std::optional<Clock::time_point>()>;

  // Keeps a watch until it is destroyed (or moved from).
  class Watched {
   public:
    Watched(Watched&& other) noexcept;
    Watched& operator=(Watched&&) = delete;
    Watched(const Watched&) = delete;
    ~Watched();

   private:
    friend class StallWatchdog;
    Watched(StallWatchdog* watchdog, uint64_t id)
        : watchdog_(watchdog), id_(id) {}
    StallWatchdog* watchdog_;
    uint64_t id_;
  };

  explicit StallWatchdog(absl::Duration timeout);
  StallWatchdog(const StallWatchdog&) = delete;
  StallWatchdog& operator=(const StallWatchdog&) = delete;
  // Every Watched must be gone first.
  ~StallWatchdog();

  // Watches until the Watched is destroyed: once `since` names a time more
  // than the timeout ago, `cancel` is called, once, on the watchdog's
  // thread and under its lock (so it must be quick and must not call into
  // the watchdog); the destruction of the Watched waits for a call in
  // progress. ResourceExhausted when the watchdog's thread, started by the
  // first watch, cannot be.
  absl::StatusOr<Watched> Watch(SinceFn since, std::function<void()> cancel)
      ABSL_LOCKS_EXCLUDED(mu_);

  absl::Duration timeout() const { return timeout_; }

 private:
  struct Entry {
    SinceFn since;
    std::function<void()> cancel;
    bool cancelled = false;
  };

  void Unwatch(uint64_t id) ABSL_LOCKS_EXCLUDED(mu_);
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  const absl::Duration timeout_;
  absl::Mutex mu_;
  std::map<uint64_t, Entry> entries_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_API_STALL_WATCHDOG_H_
