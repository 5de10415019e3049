// A set of threads running queued closures, for ReduceStream: each tensor
// of a stream is reduced as soon as it arrives, concurrently with the
// others, and its result is written when it is done. Threads are started
// on demand, when a closure finds none idle, up to a maximum, and then
// kept; so a daemon runs as many as its peak of concurrent tensors, not
// the maximum (each thread costs a stack and glibc's per-thread malloc
// cache, which fills over its life: docs/security.md, Soak). The queue of
// closures waiting for a thread is bounded: a full one refuses more.
//
//   WorkerPool pool(4, 1024);
//   if (!pool.TrySchedule([] { Work(); })) Refuse();
//   // ~WorkerPool runs what is queued, then joins.
#ifndef GRADCOMP_SERVICE_API_WORKER_POOL_H_
#define GRADCOMP_SERVICE_API_WORKER_POOL_H_

#include <cstddef>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace gradcomp::service {

class WorkerPool {
 public:
  // At most `max_threads` run closures; at most `max_queued` more wait for
  // one.
  WorkerPool(int max_threads, size_t max_queued);
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;
  ~WorkerPool();

  // Queues `work`, starting a thread for it when none is idle and fewer
  // than `max_threads` run; or returns false (and drops it) when
  // `max_queued` closures are already waiting for a thread, or when no
  // thread runs and none can be started (the system's thread limit).
  bool TrySchedule(std::function<void()> work) ABSL_LOCKS_EXCLUDED(mu_);

  size_t max_queued() const { return max_queued_; }
  // Threads started so far (they are never stopped before the pool is).
  int threads() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  const int max_threads_;
  const size_t max_queued_;
  mutable absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  // Threads waiting for a closure; queued closures beyond them need a
  // new thread.
  size_t idle_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_API_WORKER_POOL_H_
