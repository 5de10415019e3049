// The gossip reduce mode's per-job settings: which jobs gossip, on which
// topology and with which PowerGossip options, and the GossipNode that runs
// their rounds. A job's first gossip request on each rank meets the other
// ranks (its spec exchanged with each of them, keys '#gossip-spec:<a>-<b>')
// so that a rank that names another topology or rank is refused, naming
// both, before any tensor is mixed; a job's mode and spec must then stay the
// same on this rank.
//
//   GossipJobs jobs(&collective, seed);
//   GC_ASSIGN_OR_RETURN(GossipNode* node, jobs.Node("job", spec));
//   GC_RETURN_IF_ERROR(jobs.CheckAverage("other-job"));
#ifndef GRADCOMP_SERVICE_ENGINE_GOSSIP_JOBS_H_
#define GRADCOMP_SERVICE_ENGINE_GOSSIP_JOBS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "service/collective/collective.h"
#include "service/gossip/power_gossip.h"

namespace gradcomp::service {

// The spec check's rendezvous names start with this, then ":<a>-<b>" for
// the pair of ranks a < b; '#' cannot appear in a client's tensor names.
inline constexpr absl::string_view kGossipSpecKey = "#gossip-spec";

enum class ReduceMode { kAverage, kGossip };

// gradcomp.proto GossipSpec, zeros meaning the defaults.
struct GossipSpec {
  std::string topology;      // Topology::Parse's spec
  uint32_t rank = 0;         // 0: plain (exact) gossip
  uint32_t power_steps = 0;  // 0: 1
  double diffusion = 0;      // 0: 1.0
  // > 0: Choco-Gossip sending this fraction of each tensor's entries per
  // round (rank must be 0).
  double choco_topk_fraction = 0;
  // PowerGossip (rank > 0) only: every round starts every edge from fresh
  // factors (GossipOptions::warm_start = false).
  bool fresh_factors = false;
};

// "topology 'ring', rank 1, 1 power step(s), diffusion 1" with defaults
// filled in: what errors name and ranks compare.
std::string DescribeGossipSpec(const GossipSpec& spec);

// The GossipOptions `spec` asks for; InvalidArgument naming the field out
// of range.
absl::StatusOr<GossipOptions> GossipOptionsFromSpec(const GossipSpec& spec);

class GossipJobs {
 public:
  // `collective` must outlive this; `seed` keys the edges' Philox streams
  // and must be the same on every rank.
  GossipJobs(Collective* collective, uint64_t seed);
  ~GossipJobs();

  // The node of gossip job `job`. The job's first call checks `spec` with
  // every rank and builds its topology for the collective's world size;
  // later calls must name the same spec. The check exchanges the spec with
  // each other rank at once, one thread each (the collective's errors and
  // deadline apply to each). A failed check is tried again by the next
  // call, with only the ranks that have not yet sent this spec: a rank that
  // has passed sends no more, so a rank that comes back later passes on the
  // message that rank sent, which waits for it in the mailbox (as long as
  // unclaimed messages are kept, MailboxOptions::unclaimed_ttl).
  // InvalidArgument when ranks or requests disagree, when the job reduces
  // in average mode on this rank, or when the topology does not fit.
  absl::StatusOr<GossipNode*> Node(absl::string_view job,
                                   const GossipSpec& spec)
      ABSL_LOCKS_EXCLUDED(mu_);

  // GossipWorkingBytes of a gossip request of `job` naming `spec`, for a
  // tensor of `shape` on this rank, with no spec check and no wait: what a
  // caller reserves with the request when it arrives
  // (Engine::WorkingBytesAhead). By the job's node once it is built, else
  // by `spec`'s own topology for the collective's world size. 0 for a spec
  // the request would be refused for.
  uint64_t WorkingBytesAhead(absl::string_view job, const GossipSpec& spec,
                             absl::Span<const int64_t> shape)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Records that `job` reduces in average mode; InvalidArgument when it
  // gossips on this rank.
  absl::Status CheckAverage(absl::string_view job) ABSL_LOCKS_EXCLUDED(mu_);

  // Forgets `job`'s mode, spec and node: its next request starts it again,
  // spec check included. No round of the job may be running.
  void Erase(absl::string_view job) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Job;

  Collective* const collective_;
  const uint64_t seed_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Job>> jobs_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_ENGINE_GOSSIP_JOBS_H_
