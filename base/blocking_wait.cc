#include "base/blocking_wait.h"

namespace gradcomp {
namespace {

thread_local BlockingWaitObserver* observer = nullptr;
// ScopedBlockingWaits alive on this thread.
thread_local int depth = 0;

}  // namespace

BlockingWaitObserver* SetBlockingWaitObserver(
    BlockingWaitObserver* replacement) {
  BlockingWaitObserver* previous = observer;
  observer = replacement;
  return previous;
}

ScopedBlockingWait::ScopedBlockingWait() {
  if (depth++ == 0 && observer != nullptr) observer->WaitStarted();
}

ScopedBlockingWait::~ScopedBlockingWait() {
  if (--depth == 0 && observer != nullptr) observer->WaitEnded();
}

}  // namespace gradcomp
