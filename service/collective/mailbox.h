// The rendezvous of peer messages: what arrives is kept under its
// (job, tensor, step, round, phase) key until the local collective for that
// key collects it, so ranks may reach a tensor in any order. Memory stays
// bounded: unclaimed bytes have a cap, a local call for step s frees the
// tensor's older steps, and unclaimed messages expire.
//
//   mailbox.BeginStep("job", "fc1.weight", 7);
//   GC_ASSIGN_OR_RETURN(std::vector<codecs::Bytes> got,
//                       mailbox.Collect(key, {1, 2, 3}, deadline, name));
#ifndef GRADCOMP_SERVICE_COLLECTIVE_MAILBOX_H_
#define GRADCOMP_SERVICE_COLLECTIVE_MAILBOX_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/node_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "service/metrics/peer_metrics.h"
#include "service/transport/transport.h"

namespace gradcomp::service {

struct MailboxOptions {
  // Bytes of messages that arrived before their local call, with their
  // keys (a slot per key counts a few hundred bytes even when the message
  // is empty); one more is dropped, and its collective fails with
  // ResourceExhausted (at its deadline only when not even its key fits and
  // the 1 MiB of records of such drops is full).
  uint64_t max_unclaimed_bytes = uint64_t{1} << 30;
  // An unclaimed message older than this is freed, as is the record of a
  // tensor's current step when the tensor has begun no step for as long.
  absl::Duration unclaimed_ttl = absl::Minutes(5);
};

class Mailbox : public Receiver {
 public:
  // `metrics` may be null; it must outlive the mailbox.
  Mailbox(int world_size, MailboxOptions options, PeerMetrics* metrics);

  void OnMessage(int from, const MessageKey& key, codecs::Bytes data) override
      ABSL_LOCKS_EXCLUDED(mu_);
  void OnPeerLost(int rank, const absl::Status& why) override
      ABSL_LOCKS_EXCLUDED(mu_);
  // The collective of `key` fails with `why` (now, or when it is called).
  void OnCorruptMessage(int from, const MessageKey& key,
                        const absl::Status& why) override
      ABSL_LOCKS_EXCLUDED(mu_);

  // This rank starts `step` of (job, tensor): whatever is held for its
  // earlier steps is freed, and later arrivals for them are dropped (their
  // collectives are over here). A step below the last one (a trainer that
  // restarted from a checkpoint) starts over from there. The record goes
  // after unclaimed_ttl without a step (a finished job that was never
  // released, a batch id used once): a message for an older step that
  // comes later still is then held, and freed by the TTL.
  void BeginStep(const std::string& job, const std::string& tensor,
                 int64_t step) ABSL_LOCKS_EXCLUDED(mu_);

  // `job` is over on this rank: its tensors' steps are forgotten (a new run
  // under the same name may start again from step 0 without its peers'
  // first messages being taken as stale) and its unclaimed messages are
  // freed. A Collect that waits on one of its keys is left alone.
  void ForgetJob(const std::string& job) ABSL_LOCKS_EXCLUDED(mu_);

  // Every Collect, waiting or to come, fails with `why` (not OK): the
  // daemon is stopping.
  void Close(const absl::Status& why) ABSL_LOCKS_EXCLUDED(mu_);

  // Waits until a message for `key` has come from every rank in `from`, and
  // returns them indexed by rank (world_size entries; empty for ranks not in
  // `from`). DeadlineExceeded when `deadline` passes, Unavailable when a
  // rank still awaited is lost; both name the missing ranks through
  // `peer_name`, and the deadline error says what they sent instead.
  // FailedPrecondition, at once, when a rank sends this (job, tensor, step,
  // round) in a collective of another kind while this call waits (a gather
  // where this rank sums, say): the ranks chose different codecs or modes.
  // Such a message that came before the call is not taken as a mismatch:
  // it may be left from an attempt at this step that this rank gave up
  // before its collective (a NaN refused, then the step sent dense); the
  // deadline error names it.
  absl::StatusOr<std::vector<codecs::Bytes>> Collect(
      const MessageKey& key, absl::Span<const int> from, absl::Time deadline,
      const std::function<std::string(int)>& peer_name)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Bytes held for messages no call has collected yet, with their slots'
  // SlotBytes.
  uint64_t unclaimed_bytes() const ABSL_LOCKS_EXCLUDED(mu_);
  // What the slot of an early message for `key` counts against
  // max_unclaimed_bytes besides the message: its node, names and by-rank
  // entries.
  uint64_t SlotBytes(const MessageKey& key) const;

 private:
  struct Slot {
    std::vector<std::optional<codecs::Bytes>> by_rank;
    uint64_t bytes = 0;
    absl::Time created;
    bool claimed = false;       // a Collect waits on it
    std::vector<bool> awaited;  // by rank, once claimed
    int arrivals = 0;           // wakes the Collect
    // Set when a message for it was dropped (overflow) or an awaited rank
    // was lost: the Collect fails with it.
    absl::Status error;
    // A rank that sent this round in a collective of another kind (-1:
    // none), and that message's phase: the Collect fails naming both.
    int other_from = -1;
    Phase other_phase = Phase::kGather;
  };
  using TensorKey = std::pair<std::string, std::string>;  // job, tensor
  // An early message dropped before it had a slot (the cap was full): the
  // Collect of its key fails at once with RESOURCE_EXHAUSTED naming the
  // sender, instead of waiting out its deadline for a message that came.
  struct Overflow {
    int from = 0;
    uint64_t bytes = 0;  // the message's
    absl::Time at;
    // It was the news of a corrupt message, whose error is not kept.
    bool corrupt = false;
  };
  // The bytes of overflow records (their keys' OverflowBytes) kept at
  // most; beyond them a dropped message is forgotten, and its Collect waits
  // for its deadline.
  static constexpr uint64_t kMaxOverflowBytes = uint64_t{1} << 20;
  static uint64_t OverflowBytes(const MessageKey& key) {
    return sizeof(MessageKey) + sizeof(Overflow) + key.job.size() +
           key.tensor.size();
  }
  void EraseOverflowsLocked(
      const std::function<bool(const MessageKey&, const Overflow&)>& drop)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EraseOverflowLocked(
      absl::flat_hash_map<MessageKey, Overflow>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void EraseLocked(absl::node_hash_map<MessageKey, Slot>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops unclaimed slots past their TTL, when the last sweep is a quarter
  // TTL old at `now`.
  void ExpireDueLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The slot of `key`, made at `now` if there is none.
  Slot& SlotLocked(const MessageKey& key, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The slot that an arriving message of `bytes` bytes from rank `from`
  // (or the news of a corrupt one) for `key` goes to (SlotLocked, counting
  // a new one's SlotBytes); null, counted as dropped, for a step older than
  // the tensor's current one, or when a new slot would not fit under
  // max_unclaimed_bytes (then recorded in overflows_).
  Slot* ArrivalSlotLocked(const MessageKey& key, absl::Time now, int from,
                          uint64_t bytes, bool corrupt = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // RESOURCE_EXHAUSTED: rank `from`'s message of `bytes` bytes for `key`
  // came early and did not fit.
  absl::Status OverflowError(int from, const MessageKey& key,
                             uint64_t bytes) const;
  // The error of the Collect of a key whose early message was dropped.
  absl::Status OverflowError(const MessageKey& key,
                             const Overflow& overflow) const;
  // Rank `from` sent `key`: a Collect of the same (job, tensor, step,
  // round) in a collective of another kind fails, whether it awaits `from`
  // or not (the ranks disagree on how to reduce the tensor).
  void MarkOtherCollectiveLocked(int from, const MessageKey& key)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // For a deadline error: what each of `ranks` sent for `job` that no call
  // here has collected (a few keys each), as "; <peer> sent instead: ...";
  // empty when they sent nothing.
  std::string SentInsteadLocked(
      const std::string& job, absl::Span<const int> ranks,
      const std::function<std::string(int)>& peer_name) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CountDropped(absl::string_view reason);

  const int world_size_;
  const MailboxOptions options_;
  PeerMetrics* const metrics_;

  mutable absl::Mutex mu_;
  // Node map: a waiting Collect holds a pointer to its slot.
  absl::node_hash_map<MessageKey, Slot> slots_ ABSL_GUARDED_BY(mu_);
  absl::Status closed_ ABSL_GUARDED_BY(mu_);  // Close's reason
  struct CurrentStep {
    int64_t step = 0;
    absl::Time begun;  // when BeginStep last named it
  };
  absl::flat_hash_map<TensorKey, CurrentStep> current_step_
      ABSL_GUARDED_BY(mu_);
  uint64_t unclaimed_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<MessageKey, Overflow> overflows_ ABSL_GUARDED_BY(mu_);
  uint64_t overflow_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time next_expiry_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_COLLECTIVE_MAILBOX_H_
