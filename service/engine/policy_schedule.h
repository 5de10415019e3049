// The policies a daemon holds, each from the step it applies to. SetPolicy
// without a step replaces them all at once; with `from_step` it schedules
// a policy for that step and later ones, while earlier steps (in flight,
// or a late rank's) keep the one they had. Every rank that is sent the
// same schedule picks the same codec for every step, however the calls
// interleave with its reduces.
//
//   PolicySchedule schedule(std::move(initial));
//   schedule.Set(next, /*from_step=*/1000);
//   std::shared_ptr<const PolicySchedule::Entry> e = schedule.For(step);
#ifndef GRADCOMP_SERVICE_ENGINE_POLICY_SCHEDULE_H_
#define GRADCOMP_SERVICE_ENGINE_POLICY_SCHEDULE_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "service/engine/policy.h"

namespace gradcomp::service {

class PolicySchedule {
 public:
  struct Entry {
    Policy policy;
    std::string hash;  // PolicyHash(policy)
    // The first step it applies to; unset: every step.
    std::optional<int64_t> from_step;
  };

  // Policies held at once, the one for every step included: a schedule
  // takes a change every so many steps for a whole run.
  static constexpr size_t kMaxEntries = 64;

  // `initial` (already validated) applies to every step.
  explicit PolicySchedule(Policy initial);

  // Thread-safe. Unset `from_step`: `policy` applies to every step from
  // now on, replacing all others. Set: to steps >= *from_step, replacing
  // those scheduled at or after it; ResourceExhausted, changing nothing,
  // when that would hold more than kMaxEntries (none is dropped: steps
  // would silently run another policy). `policy` must be valid
  // (ValidatePolicy). Returns its hash.
  absl::StatusOr<std::string> Set(Policy policy,
                                  std::optional<int64_t> from_step)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The policy that decides `step`.
  std::shared_ptr<const Entry> For(int64_t step) const ABSL_LOCKS_EXCLUDED(mu_);
  // The one set last (its from_step the highest): what GetPolicy shows.
  std::shared_ptr<const Entry> Latest() const ABSL_LOCKS_EXCLUDED(mu_);

  // What peers compare when they connect: the hash of the one policy when
  // there is one (GetPolicy's), else 16 hex digits of FNV-1a 64 over every
  // entry's first step and hash, so that ranks holding different policies
  // for any step refuse each other (a rank restarted with only the newest
  // policy would run it for steps the others still run the old one on).
  std::string ScheduleHash() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  // By from_step; the policy for every step (none set) has key INT64_MIN,
  // and there is always one.
  std::map<int64_t, std::shared_ptr<const Entry>> entries_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_ENGINE_POLICY_SCHEDULE_H_
