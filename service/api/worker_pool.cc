#include "service/api/worker_pool.h"

#include <optional>
#include <utility>

#include "absl/status/statusor.h"
#include "base/start_thread.h"

namespace gradcomp::service {

WorkerPool::WorkerPool(Limits limits, StatsFn on_change)
    : limits_(limits), on_change_(std::move(on_change)) {}

WorkerPool::~WorkerPool() {
  std::unordered_map<std::thread::id, std::thread> threads;
  std::thread ended;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    threads.swap(threads_);
    ended = std::move(ended_);
  }
  for (auto& [id, t] : threads) t.join();
  if (ended.joinable()) ended.join();
}

WorkerPool::QueueId WorkerPool::NewQueue() {
  absl::MutexLock lock(&mu_);
  return next_queue_++;
}

bool WorkerPool::TrySchedule(std::function<void()> work, QueueId queue,
                             std::function<void()> displaced,
                             Refusal* refusal) {
  Queued dropped;
  {
    absl::MutexLock lock(&mu_);
    std::optional<QueueId> victim;
    if (queued_ >= limits_.queued) {
      const QueueId longest = LongestLocked();
      auto own = queues_.find(queue);
      const size_t own_size = own == queues_.end() ? 0 : own->second.size();
      // Taking one from the longest must leave it no shorter than `queue`.
      if (own_size + 1 >= queues_.at(longest).size()) {
        if (refusal != nullptr) *refusal = Refusal::kQueueFull;
        return false;
      }
      victim = longest;
    }
    std::deque<Queued>& mine = queues_[queue];
    if (mine.empty()) turns_.push_back(queue);
    mine.push_back({std::move(work), std::move(displaced)});
    ++queued_;
    StartThreadIfDueLocked();
    if (threads_.empty()) {
      // Nobody would ever run it.
      mine.pop_back();
      --queued_;
      if (mine.empty()) {
        queues_.erase(queue);
        turns_.pop_back();
      }
      if (refusal != nullptr) *refusal = Refusal::kNoThread;
      return false;
    }
    if (victim.has_value()) {
      // It keeps at least two, so it keeps its turn.
      std::deque<Queued>& longest = queues_.at(*victim);
      dropped = std::move(longest.back());
      longest.pop_back();
      --queued_;
    }
    PublishLocked();
  }
  if (dropped.displaced != nullptr) dropped.displaced();
  return true;
}

int WorkerPool::threads() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(threads_.size());
}

std::function<void()> WorkerPool::PopLocked() {
  const QueueId queue = turns_.front();
  turns_.pop_front();
  auto it = queues_.find(queue);
  std::function<void()> work = std::move(it->second.front().work);
  it->second.pop_front();
  --queued_;
  if (it->second.empty()) {
    queues_.erase(it);
  } else {
    turns_.push_back(queue);
  }
  return work;
}

WorkerPool::QueueId WorkerPool::LongestLocked() const {
  QueueId longest = turns_.front();
  size_t most = 0;
  for (const auto& [id, closures] : queues_) {
    if (closures.size() > most) {
      longest = id;
      most = closures.size();
    }
  }
  return longest;
}

size_t WorkerPool::RunningLocked() const {
  return threads_.size() - idle_ - waiting_;
}

void WorkerPool::StartThreadIfDueLocked() {
  // Stopping: the destructor has taken the threads to join.
  if (stopping_ || queued_ <= idle_ ||
      RunningLocked() >= static_cast<size_t>(limits_.running) ||
      threads_.size() >= static_cast<size_t>(limits_.threads)) {
    return;
  }
  absl::StatusOr<std::thread> started =
      StartThread([this] { Loop(); }, "a worker");
  if (started.ok()) {
    // Its Loop takes mu_ before it looks itself up here.
    const std::thread::id id = started->get_id();
    threads_.emplace(id, *std::move(started));
  }
}

void WorkerPool::PublishLocked() const {
  // Stopping: the destructor has taken the threads, so they go uncounted.
  if (on_change_ == nullptr || stopping_) return;
  Stats stats;
  stats.running = static_cast<int>(RunningLocked());
  stats.waiting = static_cast<int>(waiting_);
  stats.idle = static_cast<int>(idle_);
  stats.queued = queued_;
  on_change_(stats);
}

void WorkerPool::WaitStarted() {
  absl::MutexLock lock(&mu_);
  ++waiting_;
  // Its queued work may be what this closure waits for.
  StartThreadIfDueLocked();
  PublishLocked();
}

void WorkerPool::WaitEnded() {
  absl::MutexLock lock(&mu_);
  --waiting_;
  PublishLocked();
}

void WorkerPool::Loop() {
  SetBlockingWaitObserver(this);
  // Set when this thread ends for want of work: the thread that ended
  // before it, which it joins outside the lock (a thread's exit may wait,
  // as a thread_local's destructor freeing GPU memory does). The next
  // thread to end, or the destructor, joins this one.
  std::thread ended_before;
  while (true) {
    std::function<void()> work;
    {
      absl::MutexLock lock(&mu_);
      ++idle_;
      PublishLocked();
      // Past the running limit (closures back from their waits), idle
      // threads let the queue wait.
      const absl::Condition work_or_stop(
          +[](WorkerPool* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) {
            return p->stopping_ ||
                   (p->queued_ > 0 &&
                    p->RunningLocked() <
                        static_cast<size_t>(p->limits_.running));
          },
          this);
      bool woken = true;
      if (threads_.size() > static_cast<size_t>(limits_.running)) {
        woken = mu_.AwaitWithTimeout(work_or_stop, limits_.idle_timeout);
      } else {
        mu_.Await(work_or_stop);
      }
      --idle_;
      if (!woken) {
        // Idle for the timeout (so not stopping) with more threads than
        // `running`: this one ends.
        if (threads_.size() <= static_cast<size_t>(limits_.running)) continue;
        auto self = threads_.find(std::this_thread::get_id());
        ended_before = std::move(ended_);
        ended_ = std::move(self->second);
        threads_.erase(self);
        PublishLocked();
        break;
      }
      if (queued_ == 0) return;  // stopping, and nothing left to run
      work = PopLocked();
      PublishLocked();
    }
    work();
  }
  SetBlockingWaitObserver(nullptr);
  if (ended_before.joinable()) ended_before.join();
}

}  // namespace gradcomp::service
