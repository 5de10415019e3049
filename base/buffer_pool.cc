#include "base/buffer_pool.h"

#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/numeric/bits.h"
#include "absl/synchronization/mutex.h"

namespace gradcomp {

class BufferPool::State {
 public:
  State(uint64_t max_pooled_bytes, size_t min_buffer_bytes)
      : max_pooled_bytes_(max_pooled_bytes),
        min_buffer_bytes_(min_buffer_bytes) {}

  std::string Take(size_t bytes) ABSL_LOCKS_EXCLUDED(mu_) {
    const size_t size = SizeClass(bytes);
    {
      absl::MutexLock lock(&mu_);
      ++taken_;
      auto it = free_.find(size);
      if (it != free_.end() && !it->second.empty()) {
        std::string buffer = std::move(it->second.back());
        it->second.pop_back();
        pooled_bytes_ -= buffer.capacity();
        ++reused_;
        return buffer;
      }
    }
    std::string fresh;
    fresh.reserve(size);
    return fresh;
  }

  void Give(std::string buffer) ABSL_LOCKS_EXCLUDED(mu_) {
    const size_t capacity = buffer.capacity();
    if (capacity < min_buffer_bytes_) return;
    // Filed under the largest class it holds, so that every Take from
    // that class gets at least the class's capacity.
    const size_t size = FloorClass(capacity);
    buffer.clear();
    absl::MutexLock lock(&mu_);
    if (closed_ || pooled_bytes_ + capacity > max_pooled_bytes_) return;
    pooled_bytes_ += capacity;
    free_[size].push_back(std::move(buffer));
  }

  // Frees the pooled buffers; `close` also refuses later gives.
  void Drain(bool close) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::flat_hash_map<size_t, std::vector<std::string>> freed;
    {
      absl::MutexLock lock(&mu_);
      freed.swap(free_);
      pooled_bytes_ = 0;
      closed_ = closed_ || close;
    }
  }

  uint64_t max_pooled_bytes() const { return max_pooled_bytes_; }
  uint64_t pooled_bytes() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return pooled_bytes_;
  }
  uint64_t reused() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return reused_;
  }
  uint64_t taken() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return taken_;
  }

 private:
  // The largest size class <= `bytes` (bytes > 16).
  static size_t FloorClass(size_t bytes) {
    const size_t step = size_t{1} << (absl::bit_width(bytes) - 4);
    return bytes / step * step;
  }

  const uint64_t max_pooled_bytes_;
  const size_t min_buffer_bytes_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<size_t, std::vector<std::string>> free_
      ABSL_GUARDED_BY(mu_);
  uint64_t pooled_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t reused_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t taken_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

size_t BufferPool::SizeClass(size_t bytes) {
  if (bytes <= 16) return bytes;
  // Eight steps between 2^e and 2^(e+1): multiples of 2^(e-3).
  const int e = absl::bit_width(bytes) - 1;
  const size_t step = size_t{1} << (e - 3);
  return (bytes + step - 1) / step * step;
}

BufferPool::BufferPool(uint64_t max_pooled_bytes, size_t min_buffer_bytes)
    : state_(std::make_shared<State>(max_pooled_bytes, min_buffer_bytes)) {}

BufferPool::~BufferPool() { state_->Drain(/*close=*/true); }

std::string BufferPool::Take(size_t bytes) { return state_->Take(bytes); }

void BufferPool::Give(std::string buffer) { state_->Give(std::move(buffer)); }

std::shared_ptr<const std::string> BufferPool::Share(std::string buffer) {
  std::shared_ptr<State> state = state_;
  return std::shared_ptr<const std::string>(
      new std::string(std::move(buffer)), [state](const std::string* shared) {
        std::unique_ptr<std::string> owned(const_cast<std::string*>(shared));
        state->Give(std::move(*owned));
      });
}

void BufferPool::Drain() { state_->Drain(/*close=*/false); }

uint64_t BufferPool::max_pooled_bytes() const {
  return state_->max_pooled_bytes();
}
uint64_t BufferPool::pooled_bytes() const { return state_->pooled_bytes(); }
uint64_t BufferPool::reused() const { return state_->reused(); }
uint64_t BufferPool::taken() const { return state_->taken(); }

}  // namespace gradcomp
