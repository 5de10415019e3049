// Large byte buffers (std::string, which codecs::Bytes is) kept across
// steps instead of going back to malloc: a daemon's per-step buffers (peer
// messages, summed slices, encoded tensors) are the same sizes every step,
// and memory that malloc hands back to the kernel comes back as fresh pages
// that fault and are cleared again on first touch. Buffers are kept by size
// class (eight per power of two, so a reused buffer is at most 12.5 %
// larger than asked), up to a cap on the bytes pooled; what does not fit is
// freed.
//
// Ownership goes by move: Take moves a buffer out of the pool, so one that
// is in use is never handed out again; Give moves it back. Share wraps a
// buffer in a shared_ptr whose last owner gives it back, even after the pool
// is gone (then it is freed). Thread-safe.
//
//   BufferPool pool(uint64_t{256} << 20);
//   std::string message = pool.Take(total);  // empty, capacity >= total
//   message.append(...);
//   pool.Give(std::move(message));           // or let Share's owners do it
#ifndef GRADCOMP_BASE_BUFFER_POOL_H_
#define GRADCOMP_BASE_BUFFER_POOL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace gradcomp {

class BufferPool {
 public:
  // Buffers smaller than this are malloc's business: not pooled.
  static constexpr size_t kDefaultMinBufferBytes = size_t{256} << 10;

  // Keeps at most `max_pooled_bytes` of buffers of at least
  // `min_buffer_bytes` each; 0 pools nothing.
  explicit BufferPool(uint64_t max_pooled_bytes,
                      size_t min_buffer_bytes = kDefaultMinBufferBytes);
  // Frees every pooled buffer; buffers in use are freed when given back.
  ~BufferPool();
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // An empty buffer whose capacity is at least `bytes`: a pooled one of
  // `bytes`' size class when there is one, else a fresh one with that
  // class's capacity.
  std::string Take(size_t bytes);
  // Keeps `buffer` for a later Take when it is large enough and the cap
  // allows; frees it otherwise.
  void Give(std::string buffer);
  // `buffer`, shared: given back when the last owner lets go.
  std::shared_ptr<const std::string> Share(std::string buffer);

  // Frees every pooled buffer now.
  void Drain();

  uint64_t max_pooled_bytes() const;
  // Capacity of the buffers held now.
  uint64_t pooled_bytes() const;
  // Takes served by a pooled buffer, and all takes.
  uint64_t reused() const;
  uint64_t taken() const;

  // The capacity a Take of `bytes` gets: `bytes` rounded up to the next of
  // eight steps per power of two.
  static size_t SizeClass(size_t bytes);

 private:
  class State;
  // Shared with Share's deleters, which may outlive the pool.
  std::shared_ptr<State> state_;
};

}  // namespace gradcomp

#endif  // GRADCOMP_BASE_BUFFER_POOL_H_
