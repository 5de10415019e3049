#include "service/memory/truncation_guard.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace gradcomp::service {
namespace {

// One guarded range. `begin` is written last when a slot is taken and first
// (to 0) when it is given back; the handler reads begin, end, then begin
// again, so that it never uses half of one range and half of another.
struct Slot {
  std::atomic<uintptr_t> begin{0};
  std::atomic<uintptr_t> end{0};
  std::atomic<bool> faulted{false};
};

// Lock-free for the handler: it reads the atomics of slots [0, used) only.
struct Table {
  Slot slots[TruncationGuard::kCapacity];
  std::atomic<int> used{0};  // one past the highest slot ever taken
  absl::Mutex mu;            // taking and giving back slots
  bool handler_installed ABSL_GUARDED_BY(mu) = false;
  // The SIGBUS action before ours (a sanitizer's or libFuzzer's, say),
  // written once before our handler is installed, then only read.
  struct sigaction previous;
};

Table& table() {
  static Table* const t = new Table();
  return *t;
}

uintptr_t PageSize() {
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  return page;
}

// Async-signal context: atomics, mmap (a plain system call on Linux) and
// sigaction only.
void OnSigbus(int signal, siginfo_t* info, void* context) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(info->si_addr);
  Table& t = table();
  const int used = t.used.load(std::memory_order_acquire);
  for (int i = 0; info->si_code == BUS_ADRERR && i < used; ++i) {
    Slot& slot = t.slots[i];
    const uintptr_t begin = slot.begin.load(std::memory_order_acquire);
    const uintptr_t end = slot.end.load(std::memory_order_acquire);
    // A slot given back and taken again between the two loads would pair
    // one range's begin with another's end, and the mmap below could cover
    // memory of neither: begin is read again. (A slot taken again for the
    // same begin is a mapping at the same address, so that end is its.)
    if (begin == 0 || slot.begin.load(std::memory_order_acquire) != begin ||
        address < begin || address >= end) {
      continue;
    }
    // Truncation frees the object from its new end on, so every page of
    // the mapping from the faulting one on is gone: replace them at once.
    const uintptr_t page = address & ~(PageSize() - 1);
    void* zeros =
        mmap(reinterpret_cast<void*>(page), end - page, PROT_READ | PROT_WRITE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (zeros == MAP_FAILED) break;
    slot.faulted.store(true, std::memory_order_release);
    return;
  }
  // Not a guarded mapping: what was there before us handles it.
  const struct sigaction& previous = t.previous;
  if ((previous.sa_flags & SA_SIGINFO) != 0 &&
      previous.sa_sigaction != nullptr) {
    previous.sa_sigaction(signal, info, context);
    return;
  }
  if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN) {
    previous.sa_handler(signal);
    return;
  }
  // The default action (ignoring a fault would only repeat it): the faulting
  // access runs again and ends the process, or a sent signal ends it now.
  struct sigaction fallback;
  std::memset(&fallback, 0, sizeof(fallback));
  fallback.sa_handler = SIG_DFL;
  sigemptyset(&fallback.sa_mask);
  sigaction(signal, &fallback, nullptr);
  if (info->si_code <= 0) raise(signal);
}

}  // namespace

absl::StatusOr<std::unique_ptr<TruncationGuard>> TruncationGuard::Guard(
    void* base, size_t length) {
  Table& t = table();
  absl::MutexLock lock(&t.mu);
  if (!t.handler_installed) {
    struct sigaction action;
    std::memset(&action, 0, sizeof(action));
    action.sa_sigaction = OnSigbus;
    action.sa_flags = SA_SIGINFO;
    sigemptyset(&action.sa_mask);
    if (sigaction(SIGBUS, &action, &t.previous) != 0) {
      return absl::InternalError(
          absl::StrCat("sigaction(SIGBUS): ", std::strerror(errno)));
    }
    t.handler_installed = true;
  }
  const int used = t.used.load(std::memory_order_relaxed);
  int slot = 0;
  while (slot < used &&
         t.slots[slot].begin.load(std::memory_order_relaxed) != 0) {
    ++slot;
  }
  if (slot == kCapacity) {
    return absl::ResourceExhaustedError(
        absl::StrCat(kCapacity,
                     " shared-memory mappings are in use, the most the daemon "
                     "guards against truncation; unregister some"));
  }
  const uintptr_t begin = reinterpret_cast<uintptr_t>(base);
  const uintptr_t end = (begin + length + PageSize() - 1) & ~(PageSize() - 1);
  Slot& s = t.slots[slot];
  s.faulted.store(false, std::memory_order_relaxed);
  // Release: a handler that reads this end then sees the slot's earlier
  // begin = 0 (or this begin) when it reads begin again.
  s.end.store(end, std::memory_order_release);
  s.begin.store(begin, std::memory_order_release);
  if (slot == used) t.used.store(used + 1, std::memory_order_release);
  return std::unique_ptr<TruncationGuard>(new TruncationGuard(slot));
}

TruncationGuard::~TruncationGuard() {
  Table& t = table();
  absl::MutexLock lock(&t.mu);
  t.slots[slot_].begin.store(0, std::memory_order_release);
}

bool TruncationGuard::faulted() const {
  return table().slots[slot_].faulted.load(std::memory_order_acquire);
}

}  // namespace gradcomp::service
