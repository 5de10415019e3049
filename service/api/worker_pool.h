// A fixed set of threads running queued closures, for ReduceStream: each
// tensor of a stream is reduced as soon as it arrives, concurrently with
// the others, and its result is written when it is done.
//
//   WorkerPool pool(4);
//   pool.Schedule([] { Work(); });
//   // ~WorkerPool runs what is queued, then joins.
#ifndef GRADCOMP_SERVICE_API_WORKER_POOL_H_
#define GRADCOMP_SERVICE_API_WORKER_POOL_H_

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace gradcomp::service {

class WorkerPool {
 public:
  explicit WorkerPool(int threads);
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;
  ~WorkerPool();

  void Schedule(std::function<void()> work) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_API_WORKER_POOL_H_
