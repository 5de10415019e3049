#include "service/engine/job_quotas.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace gradcomp::service {

JobQuotas::Ticket::Ticket(Ticket&& other) noexcept
    : quotas_(std::exchange(other.quotas_, nullptr)),
      job_(std::exchange(other.job_, nullptr)) {}

JobQuotas::Ticket::~Ticket() {
  if (quotas_ != nullptr) quotas_->Leave(job_);
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
      it == jobs_.end() || !it->second.state_by_tensor.contains(tensor);
  if (new_tensor && it != jobs_.end()) {
    const Job& known = it->second;
    if (known.state_by_tensor.size() >= options_.max_tensors_per_job) {
      return Refuse(
          "job_tensors",
          absl::StrCat("job '", job, "' already has ",
                       known.state_by_tensor.size(),
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
  if (it == jobs_.end()) it = jobs_.try_emplace(job).first;
  Job& entry = it->second;
  entry.state_by_tensor.try_emplace(tensor, 0);
  return EnterLocked(&entry);
}

JobQuotas::Ticket JobQuotas::EnterLocked(Job* job) {
  if (job->in_flight++ == 0) ++active_jobs_;
  return Ticket(this, job);
}

void JobQuotas::Leave(Job* job) {
  absl::MutexLock lock(&mu_);
  if (--job->in_flight == 0) --active_jobs_;
}

int64_t JobQuotas::RecordState(absl::string_view job, absl::string_view tensor,
                               uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return 0;
  auto t = it->second.state_by_tensor.find(tensor);
  if (t == it->second.state_by_tensor.end()) return 0;
  const int64_t delta =
      static_cast<int64_t>(bytes) - static_cast<int64_t>(t->second);
  t->second = bytes;
  it->second.state_bytes = it->second.state_bytes + delta;
  return delta;
}

absl::StatusOr<JobQuotas::Ticket> JobQuotas::AdmitImport(
    absl::string_view job,
    const std::vector<codecs::StateStore::ImportedSize>& sizes,
    const std::function<absl::Status(int64_t)>& reserve) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.try_emplace(job).first;  // kept once seen, as in Admit
  const Job& known = it->second;
  uint64_t tensors = known.state_by_tensor.size();
  int64_t delta = 0;
  for (const auto& [tensor, bytes] : sizes) {
    auto had = known.state_by_tensor.find(tensor);
    if (had == known.state_by_tensor.end()) {
      ++tensors;
      delta += static_cast<int64_t>(bytes);
    } else {
      delta += static_cast<int64_t>(bytes) - static_cast<int64_t>(had->second);
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
  Job& entry = it->second;
  for (const auto& [tensor, bytes] : sizes) {
    entry.state_by_tensor[tensor] = bytes;
  }
  entry.state_bytes = state_bytes;
  return EnterLocked(&entry);
}

absl::StatusOr<JobQuotas::Released> JobQuotas::Release(
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
  if (it == jobs_.end()) return Released();
  const Released released{it->second.state_by_tensor.size(),
                          it->second.state_bytes};
  jobs_.erase(it);
  return released;
}

uint64_t JobQuotas::active_jobs() const {
  absl::MutexLock lock(&mu_);
  return active_jobs_;
}

}  // namespace gradcomp::service
