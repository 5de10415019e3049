#include "service/api/stall_watchdog.h"

#include <algorithm>
#include <utility>

#include "base/start_thread.h"

namespace gradcomp::service {

StallWatchdog::Watched::Watched(Watched&& other) noexcept
    : watchdog_(std::exchange(other.watchdog_, nullptr)), id_(other.id_) {}

StallWatchdog::Watched::~Watched() {
  if (watchdog_ != nullptr) watchdog_->Unwatch(id_);
}

StallWatchdog::StallWatchdog(absl::Duration timeout) : timeout_(timeout) {}

StallWatchdog::~StallWatchdog() {
  std::thread thread;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    thread = std::move(thread_);
  }
  if (thread.joinable()) thread.join();
}

absl::StatusOr<StallWatchdog::Watched> StallWatchdog::Watch(
    SinceFn since, std::function<void()> cancel) {
  absl::MutexLock lock(&mu_);
  if (!thread_.joinable()) {
    absl::StatusOr<std::thread> started =
        StartThread([this] { Loop(); }, "the stalled-stream watchdog");
    if (!started.ok()) return started.status();
    thread_ = *std::move(started);
  }
  const uint64_t id = next_id_++;
  entries_.emplace(id, Entry{std::move(since), std::move(cancel)});
  return Watched(this, id);
}

void StallWatchdog::Unwatch(uint64_t id) {
  absl::MutexLock lock(&mu_);
  entries_.erase(id);
}

void StallWatchdog::Loop() {
  // A stall is seen at most a quarter of the timeout late.
  const absl::Duration period =
      std::clamp(timeout_ / 4, absl::Milliseconds(1), absl::Seconds(1));
  absl::MutexLock lock(&mu_);
  while (!mu_.AwaitWithTimeout(absl::Condition(&stopping_), period)) {
    const Clock::time_point stalled_before =
        Clock::now() - absl::ToChronoNanoseconds(timeout_);
    for (auto& [id, entry] : entries_) {
      if (entry.cancelled) continue;
      const std::optional<Clock::time_point> since = entry.since();
      if (since.has_value() && *since < stalled_before) {
        entry.cancelled = true;
        entry.cancel();
      }
    }
  }
}

}  // namespace gradcomp::service
