#include "service/api/worker_pool.h"

#include <utility>

namespace gradcomp::service {

WorkerPool::WorkerPool(int threads, size_t max_queued)
    : max_queued_(max_queued) {
  threads_.reserve(threads);
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
}

WorkerPool::~WorkerPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

bool WorkerPool::TrySchedule(std::function<void()> work) {
  absl::MutexLock lock(&mu_);
  if (queue_.size() >= max_queued_) return false;
  queue_.push_back(std::move(work));
  return true;
}

void WorkerPool::Loop() {
  while (true) {
    std::function<void()> work;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](WorkerPool* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) {
            return p->stopping_ || !p->queue_.empty();
          },
          this));
      if (queue_.empty()) return;  // stopping, and nothing left to run
      work = std::move(queue_.front());
      queue_.pop_front();
    }
    work();
  }
}

}  // namespace gradcomp::service
