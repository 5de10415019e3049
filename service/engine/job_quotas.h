// Per-job quotas: how many jobs may reduce at the same time, how many
// distinct tensors one job may have on this daemon, and how many bytes of
// codec state one job may hold before it may add no more tensors. A reduce
// is admitted before it allocates anything and holds a Ticket while it runs;
// a refusal is ResourceExhausted naming the quota, counted in
// gradcomp_resource_exhausted_total.
//
//   JobQuotas quotas(JobQuotaOptions(), &metrics);
//   GC_ASSIGN_OR_RETURN(JobQuotas::Ticket ticket, quotas.Admit(job, tensor));
//   ...  // the reduce; then, with the tensor's state still locked:
//   budget.AddState(quotas.RecordState(job, tensor, state->ByteSize()));
#ifndef GRADCOMP_SERVICE_ENGINE_JOB_QUOTAS_H_
#define GRADCOMP_SERVICE_ENGINE_JOB_QUOTAS_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/node_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "codecs/state.h"
#include "service/metrics/metrics.h"

namespace gradcomp::service {

struct JobQuotaOptions {
  // Jobs with at least one reduce in flight at the same time.
  uint64_t max_concurrent_jobs = 16;
  // Distinct tensor names one job may reduce on this daemon (its codec
  // state entries).
  uint64_t max_tensors_per_job = 65536;
  // Codec state bytes of one job beyond which it may add no new tensor
  // (the tensors it has go on); 0: no per-job cap, only the memory budget.
  uint64_t max_state_bytes_per_job = 0;
};

// What a released job held (JobQuotas::Release, Engine::ReleaseJob).
struct ReleasedJob {
  uint64_t tensors = 0;      // tensor names the job had reduced or imported
  uint64_t state_bytes = 0;  // codec state bytes, to give back to the budget
};

class JobQuotas {
 private:
  struct Tensor {
    uint64_t state_bytes = 0;
    // Set once a reduce recorded its state (or an import brought it): a
    // tensor new to the job whose first reduces all failed before that
    // gives its slot back, once the last of them has ended.
    bool recorded = false;
    uint64_t tickets = 0;  // reduces of it in flight
  };
  struct Job {
    std::string_view name;   // its key in jobs_ (a node_hash_map: stable)
    uint64_t in_flight = 0;  // reduces and imports
    uint64_t importing = 0;  // imports: a reduce waits for them
    uint64_t state_bytes = 0;
    absl::flat_hash_map<std::string, Tensor> tensors;
  };

 public:
  // Marks its job as reducing until it is destroyed. Movable.
  class Ticket {
   public:
    Ticket(Ticket&& other) noexcept;
    Ticket& operator=(Ticket&& other) = delete;
    Ticket(const Ticket&) = delete;
    ~Ticket();

   private:
    friend class JobQuotas;
    Ticket(JobQuotas* quotas, Job* job, std::string tensor, bool import)
        : quotas_(quotas),
          job_(job),
          tensor_(std::move(tensor)),
          import_(import) {}

    JobQuotas* quotas_;
    Job* job_;
    // The tensor this ticket's Admit reduces (empty: an import's).
    std::string tensor_;
    bool import_;  // AdmitImport's
  };

  // `metrics` (may be null) counts refusals; it must outlive the quotas.
  JobQuotas(JobQuotaOptions options, Metrics* metrics);

  // Admits one reduce of (job, tensor), or ResourceExhausted when it would
  // make one job too many reduce at once, or `tensor` is new to a job that
  // has reached its tensor or state quota. A new tensor takes a slot of the
  // job's tensor quota, which it gives back when the ticket ends unless a
  // reduce of it has recorded its state by then. Waits while an import
  // into the job is in flight (a reduce of a tensor it replaces would
  // record the state the import is about to overwrite).
  absl::StatusOr<Ticket> Admit(absl::string_view job, absl::string_view tensor)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The codec state of an admitted (job, tensor) now holds `bytes` (a
  // ticket of the job must be alive); returns the change since the last
  // record, for MemoryBudget::AddState.
  int64_t RecordState(absl::string_view job, absl::string_view tensor,
                      uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);

  // An import of codec state into `job` that makes `sizes`' tensors hold
  // those bytes: ResourceExhausted, changing nothing, when the job would
  // then have more tensors than its quota or, with a state quota, more
  // state bytes, or when `reserve` refuses the change in bytes (the memory
  // budget's AddStateIfRoom; called with this object's lock held).
  // Else records them, as RecordState does, and returns a Ticket that marks
  // the job busy until the import has written them (Release refuses, and
  // reduces wait, meanwhile). FailedPrecondition while a reduce or another
  // import of the job is in flight: state is imported between steps.
  absl::StatusOr<Ticket> AdmitImport(
      absl::string_view job,
      const std::vector<codecs::StateStore::ImportedSize>& sizes,
      const std::function<absl::Status(int64_t)>& reserve)
      ABSL_LOCKS_EXCLUDED(mu_);

  // An export of `job`'s codec state: FailedPrecondition while a reduce or
  // an import of the job is in flight (its state would mix steps, or wait
  // for a collective's deadline); else a Ticket that makes the job's
  // reduces wait until the export has read the state, as an import's does
  // (nullopt for a job this daemon has not seen: nothing to guard).
  absl::StatusOr<std::optional<Ticket>> AdmitExport(absl::string_view job)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Forgets `job`. FailedPrecondition, changing nothing, while it has a
  // reduce or an import in flight. Else calls `erase` (the caller frees the
  // job's state) with this object's lock held, so that no reduce of the
  // job is admitted before its state is gone, and returns what the job held
  // (zeros for a job never seen).
  absl::StatusOr<ReleasedJob> Release(absl::string_view job,
                                      const std::function<void()>& erase)
      ABSL_LOCKS_EXCLUDED(mu_);

  uint64_t active_jobs() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // One more reduce or import of `job` is in flight.
  Ticket EnterLocked(Job* job, std::string tensor = "", bool import = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Leave(Job* job, const std::string& tensor, bool import)
      ABSL_LOCKS_EXCLUDED(mu_);
  // For Admit's wait: no import into the job is in flight.
  struct JobName {
    const JobQuotas* quotas;
    absl::string_view job;
  };
  static bool NoImportInFlight(const JobName* name)
      ABSL_NO_THREAD_SAFETY_ANALYSIS;
  // The job counts, to the metrics.
  void PublishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Refuse(absl::string_view resource, std::string message);

  const JobQuotaOptions options_;
  Metrics* const metrics_;
  mutable absl::Mutex mu_;
  // Node map: a Ticket points at its Job. Jobs are kept once seen, as their
  // codec state is, until they are released.
  absl::node_hash_map<std::string, Job> jobs_ ABSL_GUARDED_BY(mu_);
  uint64_t active_jobs_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_ENGINE_JOB_QUOTAS_H_
