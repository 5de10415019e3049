#include "service/api/worker_pool.h"

#include <utility>

#include "base/start_thread.h"

namespace gradcomp::service {

WorkerPool::WorkerPool(int max_threads, size_t max_queued)
    : max_threads_(max_threads), max_queued_(max_queued) {}

WorkerPool::~WorkerPool() {
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    threads.swap(threads_);
  }
  for (std::thread& t : threads) t.join();
}

bool WorkerPool::TrySchedule(std::function<void()> work) {
  absl::MutexLock lock(&mu_);
  if (queue_.size() >= max_queued_) return false;
  queue_.push_back(std::move(work));
  if (queue_.size() > idle_ &&
      threads_.size() < static_cast<size_t>(max_threads_)) {
    absl::StatusOr<std::thread> started =
        StartThread([this] { Loop(); }, "a worker");
    if (started.ok()) {
      threads_.push_back(*std::move(started));
    } else if (threads_.empty()) {
      // Nobody would ever run it.
      queue_.pop_back();
      return false;
    }
    // Else the running threads take it when they come free.
  }
  return true;
}

int WorkerPool::threads() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(threads_.size());
}

void WorkerPool::Loop() {
  while (true) {
    std::function<void()> work;
    {
      absl::MutexLock lock(&mu_);
      ++idle_;
      mu_.Await(absl::Condition(
          +[](WorkerPool* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) {
            return p->stopping_ || !p->queue_.empty();
          },
          this));
      --idle_;
      if (queue_.empty()) return;  // stopping, and nothing left to run
      work = std::move(queue_.front());
      queue_.pop_front();
    }
    work();
  }
}

}  // namespace gradcomp::service
