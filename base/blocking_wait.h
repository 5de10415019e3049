// Marks a wait on other threads or processes, such as a collective waiting
// for its peers or a batch member waiting for the rest of its batch, so
// that the pool running this thread (if any) can start another worker for
// its queued work meanwhile. Without it, a pool whose every worker waits
// for work still queued behind them stalls until the waits' deadlines.
// Chromium's thread pool does the same with ScopedBlockingCall.
//
//   {
//     ScopedBlockingWait waiting;  // tells this thread's observer, if any
//     mu_.AwaitWithDeadline(absl::Condition(&arrived), deadline);
//   }
//
// Nested waits tell the observer once, for the outermost.
#ifndef GRADCOMP_BASE_BLOCKING_WAIT_H_
#define GRADCOMP_BASE_BLOCKING_WAIT_H_

namespace gradcomp {

// Told when the thread it is set on starts and ends a wait. Its calls run
// on that thread, with whatever locks the waiting code holds: they must
// not call back into that code.
class BlockingWaitObserver {
 public:
  virtual ~BlockingWaitObserver() = default;
  virtual void WaitStarted() = 0;
  virtual void WaitEnded() = 0;
};

// Sets the calling thread's observer (nullptr: none) and returns the one
// it replaces. A thread set once at its start keeps it for its life.
BlockingWaitObserver* SetBlockingWaitObserver(BlockingWaitObserver* observer);

class ScopedBlockingWait {
 public:
  ScopedBlockingWait();
  ScopedBlockingWait(const ScopedBlockingWait&) = delete;
  ScopedBlockingWait& operator=(const ScopedBlockingWait&) = delete;
  ~ScopedBlockingWait();
};

}  // namespace gradcomp

#endif  // GRADCOMP_BASE_BLOCKING_WAIT_H_
