#include "service/engine/policy_schedule.h"

#include <limits>
#include <utility>

namespace gradcomp::service {

PolicySchedule::PolicySchedule(Policy initial) {
  Set(std::move(initial), std::nullopt);
}

std::string PolicySchedule::Set(Policy policy,
                                std::optional<int64_t> from_step) {
  std::string hash = PolicyHash(policy);
  auto entry =
      std::make_shared<const Entry>(Entry{std::move(policy), hash, from_step});
  const int64_t key = from_step.value_or(std::numeric_limits<int64_t>::min());
  absl::MutexLock lock(&mu_);
  entries_.erase(entries_.lower_bound(key), entries_.end());
  entries_.emplace(key, std::move(entry));
  while (entries_.size() > kMaxEntries) entries_.erase(entries_.begin());
  return hash;
}

std::shared_ptr<const PolicySchedule::Entry> PolicySchedule::For(
    int64_t step) const {
  absl::MutexLock lock(&mu_);
  auto after = entries_.upper_bound(step);
  if (after == entries_.begin()) return after->second;
  return std::prev(after)->second;
}

std::shared_ptr<const PolicySchedule::Entry> PolicySchedule::Latest() const {
  absl::MutexLock lock(&mu_);
  return entries_.rbegin()->second;
}

}  // namespace gradcomp::service
