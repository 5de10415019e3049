// Batching of a client-declared batch of tensors' rounds: they travel as one
// collective instead of one each. Every member's Run waits until all
// members of the batch have reached the round (or left it); one caller
// then runs a single inner Run for all of them:
//   - SUM rounds (say the 20 same-shape PowerSGD matrices of a DDP bucket):
//     it concatenates the dense bodies, members sorted by name, and hands
//     each member its slice of the sum;
//   - any other rounds (say the top-k payloads of a bucket's layers, any
//     shapes, and its biases sent dense): it allgathers one message holding
//     every member's payload whole and hands each member every rank's
//     payload of its own (or, for a SUM round, their sum). Each
//     peer then gets one message per batch, not one per member: per-message
//     thread hand-offs were most of a top-k step's peer CPU
//     (docs/benchmarks.md, "Where a top-k step's context switches go").
//
//   BatchingCollective batching(&peer_collective, absl::Seconds(60));
//   GC_ASSIGN_OR_RETURN(BatchSpec batch, MakeBatchSpec(id, members));
//   GC_RETURN_IF_ERROR(CheckBatchMember(batch, tensor));
//   // on each member's thread, for each of its rounds:
//   GC_ASSIGN_OR_RETURN(auto result, batching.RunBatched(key, batch, round));
//   // when the member is done with the step, whether it succeeded or not:
//   batching.Leave(key, batch);
//
// The SUM batch payload is the members' bodies in sorted-name order, then
// one absence value per member (0 where this rank contributed it, 1 where
// the member left here): a member absent on some rank gets a zero slot, so
// the concatenations line up on every rank, and a non-zero summed absence
// tells a member that some rank did not contribute it (a count of absences,
// unlike one of presences, stays non-zero in bf16 whatever the world size). The
// GATHER batch message is, per member in sorted-name order, a presence byte (1
// or 0), the payload's length (8 bytes, little-endian) and the payload
// (gather_batch_message.h). A round that mixes SUM and GATHER members (a
// top-k bucket's biases, which the policy sends dense), or SUM members
// whose bodies differ in shape, travels as such a message too: each SUM
// member then sums every rank's body itself, in rank order, so that every
// rank gets the same bits; a SUM body over kMaxGatheredSumBytes leaves the
// message and runs its own collective. So a client may put every tensor of
// a bucket in one batch, whatever codec each gets. The inner key's tensor is
// "#batch:<id>#<digest of the member list>" (with "#sum" for a slotted
// sum), so ranks that disagree on the member list, or on which of the two
// a round is, never meet (they fail at the deadline naming the ranks)
// instead of summing misaligned bodies. Members that left this rank count
// as GATHER when Leave was told so, which keeps the ranks agreeing when a
// GATHER member is refused on one of them (docs/decisions.md).
#ifndef GRADCOMP_SERVICE_COLLECTIVE_BATCHING_COLLECTIVE_H_
#define GRADCOMP_SERVICE_COLLECTIVE_BATCHING_COLLECTIVE_H_

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "service/collective/collective.h"

namespace gradcomp::service {

// Every member of a batch holds a thread while it waits for the others
// (the daemon's stream pool lets up to --max_rpc_threads wait): a bound
// keeps one batch from holding them all.
inline constexpr size_t kMaxBatchMembers = 128;

// The largest SUM payload that rides in a batch's allgather message, where
// it travels W - 1 times instead of a reduce-scatter's 2 (W - 1) / W: the
// biases and norm scales a policy sends dense (all of ResNet-50's are at
// most 8 KiB). A larger one runs its own reduce-scatter and allgather.
inline constexpr size_t kMaxGatheredSumBytes = 64 * 1024;

// A batch as the engine uses it, made once per request by MakeBatchSpec
// (the parts of a request share one): `members` sorted and unique, and
// `key`, the rendezvous name of the batch's inner collective:
// "#batch:<id>#<digest of the member list>".
struct BatchSpec {
  std::string id;
  std::vector<std::string> members;
  std::string key;
};

// Validates a request's batch and sorts its members. InvalidArgument when
// the id is empty, a member is empty, repeated or holds '#' (reserved for
// the daemon's own keys), or there are more than kMaxBatchMembers.
absl::StatusOr<BatchSpec> MakeBatchSpec(std::string id,
                                        std::vector<std::string> members);

// InvalidArgument, naming the members, unless `tensor` is one of them.
absl::Status CheckBatchMember(const BatchSpec& batch, absl::string_view tensor);

class BatchingCollective : public Collective {
 public:
  // `inner` must outlive this object. `timeout` bounds how long a member
  // waits for the other members of its batch on this rank.
  BatchingCollective(Collective* inner, absl::Duration timeout);

  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }

  // Unbatched rounds and the other exchanges pass straight through.
  absl::StatusOr<codecs::RoundResult> Run(const RoundKey& key,
                                          codecs::Round round) override;
  absl::StatusOr<std::vector<codecs::Bytes>> AllToAll(
      const RoundKey& key, std::vector<codecs::Bytes> parts) override;
  absl::StatusOr<std::vector<codecs::Bytes>> Allgather(
      const RoundKey& key, codecs::Bytes part) override;
  absl::StatusOr<std::vector<codecs::Bytes>> ExchangeWithNeighbours(
      const RoundKey& key, absl::Span<const int> neighbours,
      std::vector<codecs::Bytes> parts) override;

  // `job` is over on this rank (Engine::ReleaseJob): its batch records go,
  // so that a rerun of the job (from a checkpoint) that reaches the same
  // step does not find the members that left the old run's batches there.
  // A record with a member still waiting in RunBatched is left alone, as
  // the mailbox leaves a waiting Collect. The inner collective forgets the
  // job too.
  void ForgetJob(const std::string& job) override ABSL_LOCKS_EXCLUDED(mu_);
  // Members waiting for the rest of their batch fail with `why` at once, as
  // do later ones; the inner collective is shut down too.
  void Shutdown(const absl::Status& why) override ABSL_LOCKS_EXCLUDED(mu_);

  // Round `key.round` of member `key.tensor` of `batch` (a MakeBatchSpec
  // result) at `key.step`. Errors: DeadlineExceeded naming the members that
  // neither arrived nor left; InvalidArgument when a rank's batch message
  // is malformed or a SUM member's body differs between ranks;
  // FailedPrecondition for a member that some rank left out; the inner
  // collective's errors for every member.
  absl::StatusOr<codecs::RoundResult> RunBatched(const RoundKey& key,
                                                 const BatchSpec& batch,
                                                 codecs::Round round)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Member `key.tensor` takes part in no round >= `key.round` of step
  // `key.step`: the others go on without it. Call it once per batched
  // reduce when it ends, successful or not. `kind`, when known (its codec
  // was chosen), is the collective its rounds would have run: the choice
  // between the slotted sum and the batch message must be the same on
  // every rank, and a rank where a GATHER member left (its NaN refused)
  // must take the message, as the ranks where it arrived do.
  void Leave(const RoundKey& key, const BatchSpec& batch,
             std::optional<codecs::Collective> kind = std::nullopt)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  static constexpr int kStillIn = std::numeric_limits<int>::max();

  // One round of one batch at one step on this rank.
  struct RoundGroup {
    explicit RoundGroup(size_t members)
        : payloads(members),
          arrived(members, false),
          gather(members, false),
          alone(members, false) {}
    std::vector<codecs::Bytes> payloads;
    std::vector<bool> arrived;
    std::vector<bool> gather;  // per arrived member: its round is kGather
    // Per member: a SUM body too large for the allgather message, which
    // then runs its own collective.
    std::vector<bool> alone;
    int waiting = 0;  // members in RunBatched for this round
    bool started = false;
    bool finished = false;
    absl::Status status;
    int world_size = 0;
    size_t member_elements = 0;
    std::vector<float> sum;  // SUM: members' slices, then the absence sums
    // GATHER: per member, every rank's payload in rank order, how many
    // ranks sent one and the ranks that left it out.
    std::vector<std::vector<codecs::Bytes>> gathered;
    std::vector<int> gathered_from;
    std::vector<std::vector<int>> gathered_without;
  };
  struct Summed {
    int world_size = 0;
    size_t member_elements = 0;
    std::vector<float> sum;
  };
  struct Gathered {
    int world_size = 0;
    std::vector<std::vector<codecs::Bytes>> payloads;
    std::vector<int> from;
    std::vector<std::vector<int>> without;  // per member: ranks without it
  };
  // One batch at one step on this rank.
  struct StepBatch {
    std::vector<std::string> members;
    std::vector<int> left_from;  // per member: first round it is out of
    // Per member that left: its rounds would have been kGather (Leave's
    // `kind`), so the batch's rounds take the message, not the sum.
    std::vector<bool> left_gather;
    std::map<int, RoundGroup> rounds;
    absl::Time touched;
  };
  using StepKey = std::tuple<std::string, std::string, int64_t>;

  // The record of `batch` at `key.step`, made on first use.
  // InvalidArgument when it was made with a different member list.
  absl::StatusOr<StepBatch*> FindOrAdd(const RoundKey& key,
                                       const BatchSpec& batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets the record when every member has left and no round is open.
  void MaybeErase(const RoundKey& key, const BatchSpec& batch,
                  const StepBatch& step_batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets step records nobody has touched for a few timeouts (a member
  // that never came and never left).
  void DropStale() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static bool Complete(const StepBatch& batch, int round,
                       const RoundGroup& group);
  struct SumPlan;
  // The plan of a round whose arrived members all send SUM rounds with one
  // body shape; nullopt when some member gathers or the bodies differ.
  static std::optional<SumPlan> OneSumPlan(
      const std::vector<codecs::Bytes>& payloads,
      const std::vector<bool>& arrived, const std::vector<bool>& gather);
  // The leader's work, outside the lock: concatenate the bodies of the
  // members that `arrived`, run the inner collective, return the sum.
  absl::StatusOr<Summed> Exchange(const RoundKey& key, const BatchSpec& batch,
                                  const SumPlan& plan,
                                  const std::vector<bool>& arrived);
  // Any other round: one allgather of every arrived member's payload,
  // split by member.
  absl::StatusOr<Gathered> ExchangeGather(const RoundKey& key,
                                          const BatchSpec& batch,
                                          std::vector<codecs::Bytes> payloads,
                                          const std::vector<bool>& arrived);

  Collective* const inner_;
  const absl::Duration timeout_;
  absl::Mutex mu_;
  std::map<StepKey, StepBatch> batches_ ABSL_GUARDED_BY(mu_);
  absl::Status shutdown_ ABSL_GUARDED_BY(mu_);  // Shutdown's reason
};

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_COLLECTIVE_BATCHING_COLLECTIVE_H_
