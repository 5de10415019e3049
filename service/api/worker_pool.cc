#include "service/api/worker_pool.h"

#include <utility>

#include "absl/status/statusor.h"
#include "base/start_thread.h"

namespace gradcomp::service {

WorkerPool::WorkerPool(Limits limits) : limits_(limits) {}

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
  if (queue_.size() >= limits_.queued) return false;
  queue_.push_back(std::move(work));
  StartThreadIfDueLocked();
  if (threads_.empty()) {
    // Nobody would ever run it.
    queue_.pop_back();
    return false;
  }
  return true;
}

int WorkerPool::threads() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(threads_.size());
}

size_t WorkerPool::RunningLocked() const {
  return threads_.size() - idle_ - waiting_;
}

void WorkerPool::StartThreadIfDueLocked() {
  // Stopping: the destructor has taken the threads to join.
  if (stopping_ || queue_.size() <= idle_ ||
      RunningLocked() >= static_cast<size_t>(limits_.running) ||
      threads_.size() >= static_cast<size_t>(limits_.threads)) {
    return;
  }
  absl::StatusOr<std::thread> started =
      StartThread([this] { Loop(); }, "a worker");
  if (started.ok()) threads_.push_back(*std::move(started));
}

void WorkerPool::WaitStarted() {
  absl::MutexLock lock(&mu_);
  ++waiting_;
  // Its queued work may be what this closure waits for.
  StartThreadIfDueLocked();
}

void WorkerPool::WaitEnded() {
  absl::MutexLock lock(&mu_);
  --waiting_;
}

void WorkerPool::Loop() {
  SetBlockingWaitObserver(this);
  while (true) {
    std::function<void()> work;
    {
      absl::MutexLock lock(&mu_);
      ++idle_;
      // Past the running limit (closures back from their waits), idle
      // threads let the queue wait.
      mu_.Await(absl::Condition(
          +[](WorkerPool* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) {
            return p->stopping_ ||
                   (!p->queue_.empty() &&
                    p->RunningLocked() <
                        static_cast<size_t>(p->limits_.running));
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
