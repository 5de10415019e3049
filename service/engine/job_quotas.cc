#include "service/engine/job_quotas.h"

#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace gradcomp::service {

JobQuotas::Ticket::Ticket(Ticket&& other) noexcept
    : quotas_(std::exchange(other.quotas_, nullptr)),
      job_(std::exchange(other.job_, nullptr)),
      tensor_(std::move(other.tensor_)),
      import_(other.import_) {}

JobQuotas::Ticket::~Ticket() {
  if (quotas_ != nullptr) quotas_->Leave(job_, tensor_, import_);
}

bool JobQuotas::NoImportInFlight(const JobName* name) {
  const auto it = name->quotas->jobs_.find(name->job);
  return it == name->quotas->jobs_.end() || it->second.importing == 0;
}

JobQuotas::JobQuotas(JobQuotaOptions options, Metrics* metrics)
    : options_(options), metrics_(metrics) {}

absl::Status JobQuotas::Refuse(absl::string_view resource,
                               std::string message) {
  if (metrics_ != nullptr) metrics_->CountResourceExhausted(resource);
  return absl::ResourceExhaustedError(std::move(message));
}

absl::StatusOr<JobQuotas::Ticket> JobQuotas::Admit(absl::string_view job,
                                                   absl::string_view tensor) {
  absl::MutexLock lock(&mu_);
  const JobName name{this, job};
  mu_.Await(absl::Condition(&NoImportInFlight, &name));
  auto it = jobs_.find(job);
  const bool active = it != jobs_.end() && it->second.in_flight > 0;
  if (!active && active_jobs_ >= options_.max_concurrent_jobs) {
    return Refuse(
        "jobs",
        absl::StrCat("job '", job, "': ", active_jobs_,
                     " other jobs are reducing on this daemon, the most "
                     "allowed at once (max_concurrent_jobs ",
                     options_.max_concurrent_jobs,
                     "); expected fewer jobs per daemon, or retry later"));
  }
  const bool new_tensor =
      it == jobs_.end() || !it->second.tensors.contains(tensor);
  if (new_tensor && it != jobs_.end()) {
    const Job& known = it->second;
    if (known.tensors.size() >= options_.max_tensors_per_job) {
      return Refuse(
          "job_tensors",
          absl::StrCat("job '", job, "' already has ", known.tensors.size(),
                       " tensors on this daemon, its quota "
                       "(max_tensors_per_job ",
                       options_.max_tensors_per_job, "); tensor '", tensor,
                       "' would be one more, expected the same tensor "
                       "names every step"));
    }
    if (options_.max_state_bytes_per_job > 0 &&
        known.state_bytes >= options_.max_state_bytes_per_job) {
      return Refuse("job_state_bytes",
                    absl::StrCat("job '", job, "' holds ", known.state_bytes,
                                 " bytes of codec state, its quota "
                                 "(max_state_bytes_per_job ",
                                 options_.max_state_bytes_per_job,
                                 "); tensor '", tensor, "' cannot be added"));
    }
  }
  if (it == jobs_.end()) {
    it = jobs_.try_emplace(job).first;
    it->second.name = it->first;
  }
  Job& entry = it->second;
  ++entry.tensors[tensor].tickets;
  return EnterLocked(&entry, std::string(tensor));
}

JobQuotas::Ticket JobQuotas::EnterLocked(Job* job, std::string tensor,
                                         bool import) {
  if (job->in_flight++ == 0) ++active_jobs_;
  if (import) ++job->importing;
  PublishLocked();
  return Ticket(this, job, std::move(tensor), import);
}

void JobQuotas::PublishLocked() {
  if (metrics_ != nullptr) metrics_->SetJobs(jobs_.size(), active_jobs_);
}

void JobQuotas::Leave(Job* job, const std::string& tensor, bool import) {
  absl::MutexLock lock(&mu_);
  if (import) --job->importing;
  if (!tensor.empty()) {
    // A tensor none of whose reduces recorded its state gives its slot
    // back when the last of them ends (not the first: another reduce of it
    // still in flight would record it later, one over the quota).
    auto t = job->tensors.find(tensor);
    if (t != job->tensors.end() && --t->second.tickets == 0 &&
        !t->second.recorded) {
      job->tensors.erase(t);
    }
  }
  if (--job->in_flight == 0) {
    --active_jobs_;
    // A job none of whose reduces got as far as recording a tensor (all
    // refused, say for NaN) holds nothing: it goes, instead of counting in
    // gradcomp_jobs_held for good.
    if (job->tensors.empty()) jobs_.erase(std::string(job->name));
  }
  PublishLocked();
}

int64_t JobQuotas::RecordState(absl::string_view job, absl::string_view tensor,
                               uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return 0;
  // Present: the recording reduce's own ticket keeps it.
  Tensor& t = it->second.tensors[tensor];
  const int64_t delta =
      static_cast<int64_t>(bytes) - static_cast<int64_t>(t.state_bytes);
  t.state_bytes = bytes;
  t.recorded = true;
  it->second.state_bytes = it->second.state_bytes + delta;
  return delta;
}

absl::StatusOr<JobQuotas::Ticket> JobQuotas::AdmitImport(
    absl::string_view job,
    const std::vector<codecs::StateStore::ImportedSize>& sizes,
    const std::function<absl::Status(int64_t)>& reserve) {
  absl::MutexLock lock(&mu_);
  const auto [it, created] = jobs_.try_emplace(job);
  if (created) it->second.name = it->first;
  // A refused import into a job this daemon did not know leaves none.
  absl::Cleanup forget = [&, it = it, created = created] {
    if (created) jobs_.erase(it);
  };
  const Job& known = it->second;
  if (known.in_flight > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", job, "' has ", known.in_flight,
        " reduce(s) or import(s) in flight on this daemon; expected state "
        "imported between steps (before the first, or once every reduce of "
        "the job has returned)"));
  }
  uint64_t tensors = known.tensors.size();
  int64_t delta = 0;
  for (const codecs::StateStore::ImportedSize& size : sizes) {
    auto had = known.tensors.find(size.tensor);
    if (had == known.tensors.end()) {
      ++tensors;
      delta += static_cast<int64_t>(size.bytes);
    } else {
      delta += static_cast<int64_t>(size.bytes) -
               static_cast<int64_t>(had->second.state_bytes);
    }
  }
  if (tensors > options_.max_tensors_per_job) {
    return Refuse("job_tensors",
                  absl::StrCat("importing state into job '", job, "' of ",
                               sizes.size(), " tensors would give it ", tensors,
                               " tensors on this daemon, over its quota "
                               "(max_tensors_per_job ",
                               options_.max_tensors_per_job, ")"));
  }
  const uint64_t state_bytes = known.state_bytes + delta;
  if (options_.max_state_bytes_per_job > 0 && delta > 0 &&
      state_bytes > options_.max_state_bytes_per_job) {
    return Refuse("job_state_bytes",
                  absl::StrCat("importing state into job '", job,
                               "' would make it hold ", state_bytes,
                               " bytes of codec state, over its quota "
                               "(max_state_bytes_per_job ",
                               options_.max_state_bytes_per_job, ")"));
  }
  GC_RETURN_IF_ERROR(reserve(delta));
  std::move(forget).Cancel();
  Job& entry = it->second;
  for (const codecs::StateStore::ImportedSize& size : sizes) {
    Tensor& t = entry.tensors[size.tensor];
    t.state_bytes = size.bytes;
    t.recorded = true;
  }
  entry.state_bytes = state_bytes;
  return EnterLocked(&entry, "", /*import=*/true);
}

absl::StatusOr<std::optional<JobQuotas::Ticket>> JobQuotas::AdmitExport(
    absl::string_view job) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return std::nullopt;
  if (it->second.in_flight > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", job, "' has ", it->second.in_flight,
        " reduce(s) or import(s) in flight on this daemon; expected state "
        "exported between steps (once every reduce of the job has returned), "
        "so that it is one step's"));
  }
  return std::optional<Ticket>(EnterLocked(&it->second, "", /*import=*/true));
}

absl::StatusOr<ReleasedJob> JobQuotas::Release(
    absl::string_view job, const std::function<void()>& erase) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job);
  if (it != jobs_.end() && it->second.in_flight > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", job, "' has ", it->second.in_flight,
        " reduce(s) or import(s) in flight on this daemon; expected a job "
        "that has finished its steps (release it after the last reduce "
        "returns)"));
  }
  erase();
  if (it == jobs_.end()) return ReleasedJob();
  const ReleasedJob released{it->second.tensors.size(), it->second.state_bytes};
  jobs_.erase(it);
  PublishLocked();
  return released;
}

uint64_t JobQuotas::active_jobs() const {
  absl::MutexLock lock(&mu_);
  return active_jobs_;
}

}  // namespace gradcomp::service
