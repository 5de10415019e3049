#include "codecs/cpu/parallel.h"

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

namespace gradcomp::codecs {
namespace {

// ScopedParallelThreads' override; 0 when none.
std::atomic<int> thread_override{0};

int HardwareThreads() {
  static const int threads =
      std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const int forced = thread_override.load(std::memory_order_relaxed);
  return forced > 0 ? forced : threads;
}

// Start of part p of `parts` over [0, n), rounded down to `align`.
size_t PartBegin(size_t n, int parts, int p, size_t align) {
  if (p == parts) return n;
  const size_t raw = static_cast<size_t>(static_cast<unsigned __int128>(n) *
                                         static_cast<unsigned>(p) /
                                         static_cast<unsigned>(parts));
  return raw - raw % align;
}

}  // namespace

int ParallelParts(size_t n, const ParallelOptions& options) {
  const size_t min_per_part = std::max<size_t>(options.min_per_part, 1);
  const size_t align = std::max<size_t>(options.align, 1);
  const size_t by_size = n / std::max(min_per_part, align);
  return static_cast<int>(
      std::max<size_t>(1, std::min<size_t>(by_size, HardwareThreads())));
}

void ParallelFor(
    size_t n, const ParallelOptions& options,
    absl::FunctionRef<void(size_t begin, size_t end, int part)> fn) {
  const int parts = ParallelParts(n, options);
  const size_t align = std::max<size_t>(options.align, 1);
  if (parts == 1) {
    fn(0, n, 0);
    return;
  }
  std::vector<std::thread> threads;
  threads.reserve(parts - 1);
  for (int p = 1; p < parts; ++p) {
    const size_t begin = PartBegin(n, parts, p, align);
    const size_t end = PartBegin(n, parts, p + 1, align);
    threads.emplace_back([&fn, begin, end, p] { fn(begin, end, p); });
  }
  fn(0, PartBegin(n, parts, 1, align), 0);
  for (std::thread& t : threads) t.join();
}

ScopedParallelThreads::ScopedParallelThreads(int threads)
    : previous_(thread_override.exchange(std::max(1, threads))) {}

ScopedParallelThreads::~ScopedParallelThreads() {
  thread_override.store(previous_);
}

}  // namespace gradcomp::codecs
