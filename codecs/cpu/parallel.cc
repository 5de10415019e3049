#include "codecs/cpu/parallel.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "base/start_thread.h"

namespace gradcomp::codecs {
namespace {

// ScopedParallelThreads' override; 0 when none.
std::atomic<int> thread_override{0};

int MachineThreads() {
  static const int threads =
      std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  return threads;
}

// The parts a loop may be split into: the cores, or the test's override.
int HardwareThreads() {
  const int forced = thread_override.load(std::memory_order_relaxed);
  return forced > 0 ? forced : MachineThreads();
}

// Start of part p of `parts` over [0, n), rounded down to `align`.
size_t PartBegin(size_t n, int parts, int p, size_t align) {
  if (p == parts) return n;
  const size_t raw = static_cast<size_t>(static_cast<unsigned __int128>(n) *
                                         static_cast<unsigned>(p) /
                                         static_cast<unsigned>(parts));
  return raw - raw % align;
}

// The threads that run ParallelFor's parts 1 and up, started on first use
// and kept for the life of the process: a thread started and joined per
// call cost tens of microseconds, and glibc unmapped stacks beyond its cache
// of them (docs/benchmarks.md, "Top-k selection and threads kept").
// A caller runs part 0 and then, until its own parts are done, any queued
// part, its own or another call's: so a part that calls ParallelFor itself,
// or more parts than threads (ScopedParallelThreads), cannot deadlock.
class PartRunner {
 public:
  using Fn = absl::FunctionRef<void(size_t, size_t, int)>;

  static PartRunner& Get() {
    static PartRunner* const runner = new PartRunner(MachineThreads() - 1);
    return *runner;
  }

  // Runs fn(bounds[p], bounds[p + 1], p) for every part p: part 0 here,
  // the others queued for the threads and helped with; returns when all
  // have run.
  void Run(Fn fn, const std::vector<size_t>& bounds) ABSL_LOCKS_EXCLUDED(mu_) {
    const int parts = static_cast<int>(bounds.size()) - 1;
    Call call{&fn, parts - 1};
    {
      absl::MutexLock lock(&mu_);
      for (int p = 1; p < parts; ++p) {
        queue_.push_back({&call, bounds[p], bounds[p + 1], p});
      }
    }
    fn(bounds[0], bounds[1], 0);
    absl::MutexLock lock(&mu_);
    const auto done_or_queued = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      return call.remaining == 0 || !queue_.empty();
    };
    while (true) {
      mu_.Await(absl::Condition(&done_or_queued));
      if (call.remaining == 0) return;
      RunOneLocked();
    }
  }

 private:
  struct Call {
    const Fn* fn;
    int remaining;  // parts queued or running; guarded by mu_
  };
  struct Part {
    Call* call;
    size_t begin, end;
    int part;
  };

  // As many of `threads` as the system gives: callers run the parts no
  // thread takes, so fewer (even none) only costs speed.
  explicit PartRunner(int threads) {
    for (int t = 0; t < threads; ++t) {
      absl::StatusOr<std::thread> started =
          StartThread([this] { Loop(); }, "ParallelFor");
      if (!started.ok()) break;
      started->detach();
    }
  }

  void Loop() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    while (true) {
      const auto queued = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return !queue_.empty();
      };
      mu_.Await(absl::Condition(&queued));
      RunOneLocked();
    }
  }

  // Runs the first queued part with mu_ released.
  void RunOneLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const Part part = queue_.front();
    queue_.pop_front();
    mu_.Unlock();
    (*part.call->fn)(part.begin, part.end, part.part);
    mu_.Lock();
    --part.call->remaining;
  }

  absl::Mutex mu_;
  std::deque<Part> queue_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

int ParallelParts(size_t n, const ParallelOptions& options) {
  const size_t min_per_part = std::max<size_t>(options.min_per_part, 1);
  const size_t align = std::max<size_t>(options.align, 1);
  const size_t by_size = n / std::max(min_per_part, align);
  return static_cast<int>(
      std::max<size_t>(1, std::min<size_t>(by_size, HardwareThreads())));
}

void ParallelFor(
    size_t n, const ParallelOptions& options,
    absl::FunctionRef<void(size_t begin, size_t end, int part)> fn) {
  const int parts = ParallelParts(n, options);
  const size_t align = std::max<size_t>(options.align, 1);
  if (parts == 1) {
    fn(0, n, 0);
    return;
  }
  std::vector<size_t> bounds(parts + 1);
  for (int p = 0; p <= parts; ++p) bounds[p] = PartBegin(n, parts, p, align);
  PartRunner::Get().Run(fn, bounds);
}

ScopedParallelThreads::ScopedParallelThreads(int threads)
    : previous_(thread_override.exchange(std::max(1, threads))) {}

ScopedParallelThreads::~ScopedParallelThreads() {
  thread_override.store(previous_);
}

}  // namespace gradcomp::codecs
