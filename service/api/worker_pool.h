// A fixed set of threads running queued closures, for ReduceStream: each
// tensor of a stream is reduced as soon as it arrives, concurrently with
// the others, and its result is written when it is done. The queue of
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
  // `threads` run closures; at most `max_queued` more wait for one.
  WorkerPool(int threads, size_t max_queued);
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;
  ~WorkerPool();

  // Queues `work`, or returns false (and drops it) when `max_queued`
  // closures are already waiting for a thread.
  bool TrySchedule(std::function<void()> work) ABSL_LOCKS_EXCLUDED(mu_);

  size_t max_queued() const { return max_queued_; }

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  const size_t max_queued_;
  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_API_WORKER_POOL_H_
