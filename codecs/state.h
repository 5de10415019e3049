// Per-tensor codec state (error-feedback residuals, momentum, warm starts),
// owned by the daemon and keyed by (job, tensor).
//
//   StateStore store;
//   GC_ASSIGN_OR_RETURN(StateStore::Locked locked,
//                       store.Acquire("job", "fc1.weight", shape, dtype));
//   absl::Span<float> residual = locked->Buffer("ef.residual", numel);
//
// A change of shape or dtype resets the tensor's state; StateStore counts
// resets so the daemon can export the count as a metric.
#ifndef GRADCOMP_CODECS_STATE_H_
#define GRADCOMP_CODECS_STATE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "codecs/tensor.h"

namespace gradcomp::codecs {

// Named fp32 buffers of one tensor. Not thread-safe: StateStore::Locked
// serialises access.
class TensorState {
 public:
  // The buffer `name` with `size` elements, zero-filled when first made or
  // when its size changed. Names are prefixed by their owner ("ef.", "dgc.").
  absl::Span<float> Buffer(absl::string_view name, size_t size);

  // The buffer `name` if it exists.
  std::optional<absl::Span<float>> Find(absl::string_view name);

  // Drops the buffer `name`, if it exists.
  void Erase(absl::string_view name);
  void Clear() { buffers_.clear(); }
  size_t ByteSize() const;
  const std::map<std::string, std::vector<float>, std::less<>>& buffers()
      const {
    return buffers_;
  }

 private:
  std::map<std::string, std::vector<float>, std::less<>> buffers_;
};

// Which rank of how many an exported state belongs to: residuals, momenta
// and gossip edges are a rank's own. Unknown (world_size 0) in blobs of
// format 1, and for a store that does not say.
struct StateOrigin {
  int rank = 0;
  int world_size = 0;
};

class StateStore {
 private:
  struct Entry {
    absl::Mutex mu;
    std::vector<int64_t> shape ABSL_GUARDED_BY(mu);
    int dtype ABSL_GUARDED_BY(mu) = 0;
    std::string owner ABSL_GUARDED_BY(mu);  // Acquire's last non-empty one
    // state.ByteSize() as of the last unlock: read without the lock, so that
    // a metrics scrape never waits for a tensor whose step is in a collective.
    std::atomic<size_t> bytes{0};
    TensorState state ABSL_GUARDED_BY(mu);
  };

 public:
  // Exclusive access to one tensor's state for as long as it lives.
  class Locked {
   public:
    explicit Locked(std::shared_ptr<Entry> entry);
    Locked(Locked&& other) = default;
    // Releases the lock this one held before taking over `other`'s.
    Locked& operator=(Locked&& other);
    ~Locked();
    TensorState* operator->() const;
    TensorState& operator*() const;

    // When Acquire reset the state (another shape, dtype or owner), puts
    // back the state, shape, dtype and owner it replaced, as if this
    // Acquire had not been: for a step that then failed, so that a request
    // refused for a wrong shape or codec loses nothing (the resets count
    // stays). Nothing when Acquire reset nothing, or once called.
    void RestoreIfReset();

   private:
    friend class StateStore;
    // What a reset replaced, kept until the lock goes.
    struct Replaced {
      std::vector<int64_t> shape;
      int dtype = 0;
      std::string owner;
      TensorState state;
    };

    // Publishes the state's size for ByteSize(), then unlocks.
    void Release();

    std::shared_ptr<Entry> entry_;
    std::optional<Replaced> replaced_;
  };

  // Locks the state of (job, tensor), creating it empty, or resetting it
  // (and counting the reset) when `shape` or `dtype` (the caller's opaque
  // element-type code) differs from the last call's, or when a non-empty
  // `owner` (the codec about to use the state) differs from the last
  // non-empty one: another codec's buffers would otherwise hold memory for
  // ever and come back stale when it does. An empty owner (a dense codec,
  // which keeps none) leaves the state to the next codec that has one;
  // imported state keeps its exporter's owner (none from a format-1 blob).
  Locked Acquire(absl::string_view job, absl::string_view tensor,
                 absl::Span<const int64_t> shape, int dtype,
                 absl::string_view owner = {});

  // Number of resets caused by a change of shape, dtype or owner, since
  // start.
  uint64_t resets() const;
  // Bytes held by every tensor's state.
  size_t ByteSize() const;
  // Bytes held by the states of `tensors` of `job` that exist, as of their
  // last unlock (without waiting for a tensor in use).
  size_t ByteSizeOf(absl::string_view job,
                    absl::Span<const std::string> tensors) const;

  // One tensor of a blob that Import is about to restore: its name and the
  // bytes its state will hold.
  struct ImportedSize {
    std::string tensor;
    size_t bytes = 0;
    bool skip = false;  // set by the admission: left out of the import
  };
  // Sees an import's tensors once the blob is valid and before anything
  // changes; an error refuses the import (the daemon's quotas and budget).
  // It may mark tensors to leave out (state this daemon would never use).
  using ImportAdmission =
      std::function<absl::Status(std::vector<ImportedSize>&)>;

  using Origin = StateOrigin;

  // Serialises every tensor state of `job` (a self-describing, versioned
  // binary format: each tensor's shape, dtype, owner and buffers, and the
  // exporter's `origin`) and restores it; Import replaces the job's
  // tensors that the blob names and validates the blob completely (every
  // value finite), and asks `admit` when given, before touching any. A
  // blob of another rank in a world of the same size than `importer` is
  // FailedPrecondition naming both; one of another world size is taken
  // (the caller leaves out what that world's sharding kept). Imported
  // state keeps its owner, so the next codec resets it exactly when it
  // would have without the checkpoint.
  absl::StatusOr<Bytes> Export(absl::string_view job, Origin origin = {}) const;
  absl::Status Import(absl::string_view job, absl::string_view blob,
                      const ImportAdmission& admit = nullptr,
                      Origin importer = {});

  // Forgets every tensor state of `job` and returns how many entries it
  // held. A Locked held on one of them stays valid; its state is dropped
  // when it is released. The caller makes sure nothing still uses the job.
  size_t EraseJob(absl::string_view job);

 private:
  static std::shared_ptr<Entry> NewEntry(absl::Span<const int64_t> shape,
                                         int dtype);

  mutable absl::Mutex mu_;
  // Key: job + '\0' + tensor.
  absl::flat_hash_map<std::string, std::shared_ptr<Entry>> entries_
      ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> resets_{0};
};

}  // namespace gradcomp::codecs

#endif  // GRADCOMP_CODECS_STATE_H_
