#include "service/engine/policy_schedule.h"

#include <iterator>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/fnv1a.h"

namespace gradcomp::service {

PolicySchedule::PolicySchedule(Policy initial) {
  std::string hash = PolicyHash(initial);
  entries_.emplace(std::numeric_limits<int64_t>::min(),
                   std::make_shared<const Entry>(
                       Entry{std::move(initial), std::move(hash), {}}));
}

absl::StatusOr<std::string> PolicySchedule::Set(
    Policy policy, std::optional<int64_t> from_step) {
  std::string hash = PolicyHash(policy);
  auto entry =
      std::make_shared<const Entry>(Entry{std::move(policy), hash, from_step});
  const int64_t key = from_step.value_or(std::numeric_limits<int64_t>::min());
  absl::MutexLock lock(&mu_);
  const auto replaced = entries_.lower_bound(key);
  const size_t kept =
      static_cast<size_t>(std::distance(entries_.begin(), replaced));
  if (kept + 1 > kMaxEntries) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the daemon holds ", kept, " policies by step before ", key,
        ", the most it keeps (", kMaxEntries,
        "; past ones stay, as a job that starts again from an early step "
        "uses them); expected a policy set without from_step (it replaces "
        "them all) while no step runs, or one from an earlier step (it "
        "replaces those at or after it)"));
  }
  entries_.erase(replaced, entries_.end());
  entries_.emplace(key, std::move(entry));
  return hash;
}

std::shared_ptr<const PolicySchedule::Entry> PolicySchedule::For(
    int64_t step) const {
  absl::MutexLock lock(&mu_);
  // The INT64_MIN entry is always there: some entry is at or below `step`.
  return std::prev(entries_.upper_bound(step))->second;
}

std::string PolicySchedule::ScheduleHash() const {
  absl::MutexLock lock(&mu_);
  if (entries_.size() == 1) return entries_.begin()->second->hash;
  Fnv1a64 h;
  for (const auto& [from_step, entry] : entries_) {
    h.Update(absl::StrCat(from_step, ":", entry->hash, ";"));
  }
  return absl::StrFormat("%016x", h.value());
}

std::shared_ptr<const PolicySchedule::Entry> PolicySchedule::Latest() const {
  absl::MutexLock lock(&mu_);
  return entries_.rbegin()->second;
}

}  // namespace gradcomp::service
