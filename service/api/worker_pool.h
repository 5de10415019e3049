// A set of threads running queued closures, for ReduceStream: each tensor
// of a stream is reduced as soon as it arrives, concurrently with the
// others, and its result is written when it is done. Threads are started
// on demand, when a closure finds none idle, and then kept; so a daemon
// runs as many as its peak of concurrent tensors, not the maximum (each
// thread costs a stack and glibc's per-thread malloc cache, which fills
// over its life: docs/security.md, Soak). Threads beyond `running` that
// find nothing to do for `idle_timeout` end. The queue of closures
// waiting for a thread is bounded: a full one refuses more.
//
// A closure inside a ScopedBlockingWait (base/blocking_wait.h: a tensor's
// collective waiting for its peers, a batch member for the rest of its
// batch) does not count against `running`: the pool starts another thread
// for its queued work, up to `threads` in all. Otherwise tensors waiting
// for members of their batches could hold every thread while those
// members sit in the queue, until the collective deadline.
//
// Closures are scheduled into queues (one per ReduceStream), served in
// turn, one closure of each: a client with many tensors waiting delays
// another's by at most one of its own per free thread, not by all of them.
// A full pool refuses a closure of the queue holding the most; one of
// another queue displaces that queue's newest closure (which is dropped,
// and told), so a flooding client is refused rather than everyone else.
//
//   WorkerPool::Limits limits;
//   limits.running = 4;
//   limits.threads = 64;
//   WorkerPool pool(limits);
//   const WorkerPool::QueueId mine = pool.NewQueue();
//   if (!pool.TrySchedule([] { Work(); }, mine, [] { Refuse(); })) Refuse();
//   // ~WorkerPool runs what is queued, then joins.
#ifndef GRADCOMP_SERVICE_API_WORKER_POOL_H_
#define GRADCOMP_SERVICE_API_WORKER_POOL_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <thread>
#include <unordered_map>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/blocking_wait.h"

namespace gradcomp::service {

class WorkerPool : private BlockingWaitObserver {
 public:
  struct Limits {
    // Closures running at once, not counting those in a blocking wait.
    int running = 2;
    // Threads at most, those in a blocking wait included; at least
    // `running`.
    int threads = 2;
    // Closures waiting for a thread, in all queues; one beyond them is
    // refused, or displaces another (TrySchedule).
    size_t queued = 4096;
    // How long a thread beyond `running` waits for a closure before it
    // ends: those a burst of waits started go, those every step uses stay.
    absl::Duration idle_timeout = absl::Minutes(1);
  };

  // What the pool holds now: its threads by what they do, and the closures
  // waiting for one.
  struct Stats {
    int running = 0;  // running a closure outside a blocking wait
    int waiting = 0;  // running a closure in a blocking wait
    int idle = 0;     // waiting for a closure
    size_t queued = 0;
  };
  // Called, under the pool's lock, whenever the Stats change (so it must
  // be quick and must not call into the pool): for a daemon's metrics.
  using StatsFn = std::function<void(const Stats&)>;

  explicit WorkerPool(Limits limits, StatsFn on_change = nullptr);
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;
  ~WorkerPool() override;

  // Names the closures of one client (a ReduceStream's), which the pool
  // serves in turn with those of the others.
  using QueueId = uint64_t;
  // A queue no other caller has. Queue 0 is everyone's who names none.
  QueueId NewQueue() ABSL_LOCKS_EXCLUDED(mu_);

  // Queues `work` at the back of `queue`, starting a thread for it when
  // none is idle, fewer than `running` closures run and fewer than
  // `threads` threads exist. When `queued` closures already wait, `work`
  // is refused (false, and dropped) if its queue would then hold as many
  // as the longest queue; otherwise it displaces the newest closure of the
  // longest queue, which is dropped after its `displaced` is called (here,
  // outside the pool's lock). Also false when no thread runs and none can
  // be started (the system's thread limit). `refusal`, if set, says which.
  enum class Refusal {
    kQueueFull,  // its queue would hold as many as the longest
    kNoThread,   // no thread runs, and none could be started
    kDisplaced,  // never returned: what a `displaced` closure's caller
                 // answers for it
  };
  bool TrySchedule(std::function<void()> work, QueueId queue = 0,
                   std::function<void()> displaced = nullptr,
                   Refusal* refusal = nullptr) ABSL_LOCKS_EXCLUDED(mu_);

  size_t max_queued() const { return limits_.queued; }
  // Threads running now (started and not ended).
  int threads() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void WaitStarted() override ABSL_LOCKS_EXCLUDED(mu_);
  void WaitEnded() override ABSL_LOCKS_EXCLUDED(mu_);

  struct Queued {
    std::function<void()> work;
    std::function<void()> displaced;
  };

  void Loop() ABSL_LOCKS_EXCLUDED(mu_);
  // The next closure to run: the oldest of the queue whose turn it is.
  // Needs queued_ > 0.
  std::function<void()> PopLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The queue holding the most closures (the first found of those that
  // tie). Needs queued_ > 0.
  QueueId LongestLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Threads running a closure outside a blocking wait.
  size_t RunningLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts a thread when queued closures outnumber the idle threads, one
  // more could run and the thread limit allows it; failing that (the
  // system's limit), the threads already running take the work later.
  void StartThreadIfDueLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands the Stats to on_change_, if set.
  void PublishLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Limits limits_;
  const StatsFn on_change_;
  mutable absl::Mutex mu_;
  // The closures waiting for a thread, by queue; a queue with none has no
  // entry.
  std::unordered_map<QueueId, std::deque<Queued>> queues_ ABSL_GUARDED_BY(mu_);
  // The queues with closures waiting, the one whose turn is next first.
  std::deque<QueueId> turns_ ABSL_GUARDED_BY(mu_);
  // Closures in queues_, in all.
  size_t queued_ ABSL_GUARDED_BY(mu_) = 0;
  QueueId next_queue_ ABSL_GUARDED_BY(mu_) = 1;
  // Threads waiting for a closure.
  size_t idle_ ABSL_GUARDED_BY(mu_) = 0;
  // Threads whose closure is in a blocking wait.
  size_t waiting_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::unordered_map<std::thread::id, std::thread> threads_
      ABSL_GUARDED_BY(mu_);
  // The last thread that ended for want of work, for the next one to end
  // (or the destructor) to join.
  std::thread ended_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_API_WORKER_POOL_H_
