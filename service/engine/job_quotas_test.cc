#include "service/engine/job_quotas.h"

#include <optional>
#include <thread>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/metrics/metrics.h"
#include "service/metrics/metrics_testing.h"

namespace gradcomp::service {
namespace {

using ::testing::HasSubstr;

// One reduce of (job, tensor) that records `bytes` of codec state while its
// ticket lives, as the engine's do; the change it recorded.
int64_t Reduced(JobQuotas& quotas, const std::string& job,
                const std::string& tensor, uint64_t bytes) {
  absl::StatusOr<JobQuotas::Ticket> ticket = quotas.Admit(job, tensor);
  EXPECT_TRUE(ticket.ok()) << ticket.status();
  return quotas.RecordState(job, tensor, bytes);
}

double Refusals(const Metrics& metrics, const std::string& resource) {
  return MetricValue(*metrics.collectable(),
                     "gradcomp_resource_exhausted_total",
                     {{"resource", resource}});
}

TEST(JobQuotasTest, ConcurrentJobsAreCappedWhileTheirTicketsLive) {
  Metrics metrics(nullptr, "test");
  JobQuotaOptions options;
  options.max_concurrent_jobs = 2;
  JobQuotas quotas(options, &metrics);
  std::optional<JobQuotas::Ticket> a(*quotas.Admit("a", "w"));
  auto b = quotas.Admit("b", "w");
  ASSERT_TRUE(b.ok());
  // A job already reducing may start more reduces.
  auto a2 = quotas.Admit("a", "v");
  ASSERT_TRUE(a2.ok()) << a2.status();
  EXPECT_EQ(quotas.active_jobs(), 2);
  auto c = quotas.Admit("c", "w");
  ASSERT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(c.status().message(),
              HasSubstr("job 'c': 2 other jobs are reducing on this daemon"));
  EXPECT_EQ(Refusals(metrics, "jobs"), 1);
  // Job a still has a reduce in flight: c must wait for both to finish.
  a.reset();
  EXPECT_FALSE(quotas.Admit("c", "w").ok());
  { auto done = std::move(*a2); }
  EXPECT_EQ(quotas.active_jobs(), 1);
  EXPECT_TRUE(quotas.Admit("c", "w").ok());
}

TEST(JobQuotasTest, TensorsPerJobAreCappedButKnownTensorsGoOn) {
  Metrics metrics(nullptr, "test");
  JobQuotaOptions options;
  options.max_tensors_per_job = 2;
  JobQuotas quotas(options, &metrics);
  // Each reduce records its tensor's state (0 bytes: a stateless codec).
  Reduced(quotas, "job", "a", 0);
  Reduced(quotas, "job", "b", 0);
  auto third = quotas.Admit("job", "c");
  ASSERT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(third.status().message(),
              HasSubstr("job 'job' already has 2 tensors on this daemon"));
  EXPECT_EQ(Refusals(metrics, "job_tensors"), 1);
  EXPECT_TRUE(quotas.Admit("job", "a").ok());
  // Another job has its own quota.
  EXPECT_TRUE(quotas.Admit("other", "c").ok());
}

TEST(JobQuotasTest, StateQuotaStopsNewTensorsAndRecordsDeltas) {
  Metrics metrics(nullptr, "test");
  JobQuotaOptions options;
  options.max_state_bytes_per_job = 1000;
  JobQuotas quotas(options, &metrics);
  EXPECT_EQ(Reduced(quotas, "job", "a", 600), 600);
  EXPECT_EQ(Reduced(quotas, "job", "b", 500), 500);
  auto refused = quotas.Admit("job", "c");
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("holds 1100 bytes of codec state"));
  EXPECT_EQ(Refusals(metrics, "job_state_bytes"), 1);
  // A state that shrank (a reset) gives its bytes back.
  EXPECT_EQ(Reduced(quotas, "job", "a", 0), -600);
  EXPECT_TRUE(quotas.Admit("job", "c").ok());
  EXPECT_EQ(quotas.RecordState("unknown", "a", 10), 0);
}

// An import counts like the reduces that would have made its state: over a
// quota, or refused by the budget's reserve, it changes nothing.
TEST(JobQuotasTest, AnImportIsAdmittedAgainstBothQuotasAndTheReserve) {
  Metrics metrics(nullptr, "test");
  JobQuotaOptions options;
  options.max_tensors_per_job = 3;
  options.max_state_bytes_per_job = 1000;
  JobQuotas quotas(options, &metrics);
  EXPECT_EQ(Reduced(quotas, "job", "a", 600), 600);
  int64_t reserved = 0;
  auto reserve = [&](int64_t delta) {
    reserved += delta;
    return absl::OkStatus();
  };

  absl::Status many =
      quotas.AdmitImport("job", {{"b", 1}, {"c", 1}, {"d", 1}}, reserve)
          .status();
  EXPECT_EQ(many.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(many.message(), HasSubstr("would give it 4 tensors"));
  absl::Status big =
      quotas.AdmitImport("job", {{"a", 300}, {"b", 800}}, reserve).status();
  EXPECT_EQ(big.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(big.message(), HasSubstr("would make it hold 1100 bytes"));
  absl::Status no_room =
      quotas
          .AdmitImport(
              "job", {{"b", 100}},
              [](int64_t) { return absl::ResourceExhaustedError("no room"); })
          .status();
  EXPECT_EQ(no_room.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(reserved, 0);

  // Replacing a's 600 bytes by 300 and adding b's 500: 200 more.
  ASSERT_TRUE(
      quotas.AdmitImport("job", {{"a", 300}, {"b", 500}}, reserve).ok());
  EXPECT_EQ(reserved, 200);
  EXPECT_EQ(quotas.RecordState("job", "b", 400), -100);
  EXPECT_EQ(Refusals(metrics, "job_tensors"), 1);
  EXPECT_EQ(Refusals(metrics, "job_state_bytes"), 1);
  // A refused import into a job this daemon has not seen leaves no job.
  EXPECT_EQ(MetricValue(*metrics.collectable(), "gradcomp_jobs_held"), 1);
  EXPECT_FALSE(
      quotas
          .AdmitImport(
              "refused", {{"x", 64}},
              [](int64_t) { return absl::ResourceExhaustedError("no room"); })
          .ok());
  ASSERT_TRUE(quotas.Admit("job", "a").ok());  // publishes the count
  EXPECT_EQ(MetricValue(*metrics.collectable(), "gradcomp_jobs_held"), 1);
  // An import into a job this daemon has not seen.
  ASSERT_TRUE(quotas.AdmitImport("new", {{"x", 64}}, reserve).ok());
  EXPECT_EQ(reserved, 264);
}

// State is imported between steps: an import while a reduce of the job is
// in flight is refused, and a reduce waits for an import in flight (it
// would record the state the import is about to replace). Other jobs go on.
TEST(JobQuotasTest, ImportsAndReducesOfAJobDoNotOverlap) {
  JobQuotas quotas(JobQuotaOptions(), nullptr);
  const auto reserve = [](int64_t) { return absl::OkStatus(); };
  {
    absl::StatusOr<JobQuotas::Ticket> reducing = quotas.Admit("job", "a");
    ASSERT_TRUE(reducing.ok());
    const absl::Status busy =
        quotas.AdmitImport("job", {{"a", 8}}, reserve).status();
    EXPECT_EQ(busy.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(busy.message(),
                HasSubstr("job 'job' has 1 reduce(s) or import(s) in flight"));
    EXPECT_TRUE(quotas.AdmitImport("other", {{"a", 8}}, reserve).ok());
  }
  std::optional<JobQuotas::Ticket> importing;
  {
    absl::StatusOr<JobQuotas::Ticket> admitted =
        quotas.AdmitImport("job", {{"a", 8}}, reserve);
    ASSERT_TRUE(admitted.ok()) << admitted.status();
    importing.emplace(std::move(*admitted));
  }
  absl::Notification reduced;
  std::thread reduce([&] {
    EXPECT_TRUE(quotas.Admit("job", "a").ok());
    reduced.Notify();
  });
  EXPECT_FALSE(reduced.WaitForNotificationWithTimeout(absl::Milliseconds(100)));
  EXPECT_TRUE(quotas.Admit("other", "a").ok());
  importing.reset();
  reduce.join();
  EXPECT_TRUE(reduced.HasBeenNotified());
}

// An export waits for nothing and mixes no steps: refused while a reduce
// of the job is in flight (it used to wait for that reduce, up to its
// collective deadline, and read tensors of two steps), and the job's
// reduces wait while it reads.
TEST(JobQuotasTest, ExportsAndReducesOfAJobDoNotOverlap) {
  JobQuotas quotas(JobQuotaOptions(), nullptr);
  auto unseen = quotas.AdmitExport("job");
  ASSERT_TRUE(unseen.ok());
  EXPECT_FALSE(unseen->has_value());
  {
    absl::StatusOr<JobQuotas::Ticket> reducing = quotas.Admit("job", "a");
    ASSERT_TRUE(reducing.ok());
    quotas.RecordState("job", "a", 8);  // the job now holds state
    const absl::Status busy = quotas.AdmitExport("job").status();
    EXPECT_EQ(busy.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(busy.message(),
                HasSubstr("expected state exported between steps"));
  }
  absl::StatusOr<std::optional<JobQuotas::Ticket>> exporting =
      quotas.AdmitExport("job");
  ASSERT_TRUE(exporting.ok()) << exporting.status();
  ASSERT_TRUE(exporting->has_value());
  absl::Notification reduced;
  std::thread reduce([&] {
    EXPECT_TRUE(quotas.Admit("job", "a").ok());
    reduced.Notify();
  });
  EXPECT_FALSE(reduced.WaitForNotificationWithTimeout(absl::Milliseconds(100)));
  exporting->reset();
  reduce.join();
  EXPECT_TRUE(reduced.HasBeenNotified());
}

// A new tensor whose reduce fails before recording its state gives its
// slot back; one recorded keeps it. A reduce admitted while another held
// the new slot records its state even if that one gave the slot back.
TEST(JobQuotasTest, ANewTensorThatRecordedNothingGivesItsSlotBack) {
  Metrics metrics(nullptr, "test");
  JobQuotaOptions options;
  options.max_tensors_per_job = 1;
  JobQuotas quotas(options, &metrics);
  { ASSERT_TRUE(quotas.Admit("job", "failed").ok()); }
  {
    absl::StatusOr<JobQuotas::Ticket> first = quotas.Admit("job", "a");
    ASSERT_TRUE(first.ok()) << first.status();
    absl::StatusOr<JobQuotas::Ticket> second = quotas.Admit("job", "a");
    ASSERT_TRUE(second.ok()) << second.status();
    { JobQuotas::Ticket gone = *std::move(first); }  // failed: gives back
    EXPECT_EQ(quotas.RecordState("job", "a", 100), 100);
  }
  EXPECT_EQ(quotas.Admit("job", "b").status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(quotas.RecordState("job", "a", 40), -60);
}

// A new tensor's first reduce fails while a second reduce of it still runs:
// the tensor keeps its slot until that one ends too. Before, the first
// gave it back at once, a third tensor took it, and the second's record
// then made the job one over its quota.
TEST(JobQuotasTest, ANewTensorKeepsItsSlotWhileAnyReduceOfItRuns) {
  Metrics metrics(nullptr, "test");
  JobQuotaOptions options;
  options.max_tensors_per_job = 2;
  JobQuotas quotas(options, &metrics);
  absl::StatusOr<JobQuotas::Ticket> first = quotas.Admit("job", "a");
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<JobQuotas::Ticket> second = quotas.Admit("job", "a");
  ASSERT_TRUE(second.ok()) << second.status();
  { JobQuotas::Ticket failed = *std::move(first); }
  absl::StatusOr<JobQuotas::Ticket> b = quotas.Admit("job", "b");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(quotas.Admit("job", "c").status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(quotas.RecordState("job", "a", 10), 10);
  // Once every reduce of a tensor that recorded nothing has ended, it goes.
  { JobQuotas::Ticket failed = *std::move(b); }
  { JobQuotas::Ticket done = *std::move(second); }
  EXPECT_TRUE(quotas.Admit("job", "c").ok());
}

// A job none of whose reduces recorded a tensor (each refused, say for a
// NaN, before its codec state) is not held once they end; one that
// recorded a tensor, even with no state (a stateless codec), still is.
TEST(JobQuotasTest, AJobWhoseReducesRecordedNothingIsNotHeld) {
  Metrics metrics(nullptr, "test");
  JobQuotas quotas(JobQuotaOptions(), &metrics);
  auto held = [&] {
    return MetricValue(*metrics.collectable(), "gradcomp_jobs_held");
  };
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<JobQuotas::Ticket> refused =
        quotas.Admit(absl::StrCat("job", i), "w");
    ASSERT_TRUE(refused.ok()) << refused.status();
    EXPECT_EQ(held(), 1);  // while it is in flight
  }
  EXPECT_EQ(held(), 0);
  {
    absl::StatusOr<JobQuotas::Ticket> reduced = quotas.Admit("kept", "w");
    ASSERT_TRUE(reduced.ok()) << reduced.status();
    EXPECT_EQ(quotas.RecordState("kept", "w", 0), 0);
  }
  EXPECT_EQ(held(), 1);
  absl::StatusOr<ReleasedJob> released = quotas.Release("kept", [] {});
  ASSERT_TRUE(released.ok()) << released.status();
  EXPECT_EQ(released->tensors, 1u);
}

// Release forgets a job's tensors and bytes (a new tensor is admitted again
// under a tensor quota the job had filled) and erases its state under the
// lock; a job with a reduce or an import in flight is refused unchanged.
TEST(JobQuotasTest, ReleaseForgetsAnIdleJobAndRefusesABusyOne) {
  Metrics metrics(nullptr, "test");
  JobQuotaOptions options;
  options.max_tensors_per_job = 2;
  JobQuotas quotas(options, &metrics);
  EXPECT_EQ(Reduced(quotas, "job", "a", 100), 100);
  EXPECT_EQ(Reduced(quotas, "job", "b", 20), 20);
  EXPECT_FALSE(quotas.Admit("job", "c").ok());
  int erased = 0;
  auto erase = [&] { ++erased; };

  {
    absl::StatusOr<JobQuotas::Ticket> busy = quotas.Admit("job", "a");
    ASSERT_TRUE(busy.ok());
    EXPECT_EQ(MetricValue(*metrics.collectable(), "gradcomp_jobs_active"), 1);
    absl::StatusOr<ReleasedJob> refused = quotas.Release("job", erase);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(refused.status().message(), HasSubstr("1 reduce(s)"));
  }
  {
    absl::StatusOr<JobQuotas::Ticket> importing = quotas.AdmitImport(
        "job", {{"a", 100}}, [](int64_t) { return absl::OkStatus(); });
    ASSERT_TRUE(importing.ok());
    EXPECT_FALSE(quotas.Release("job", erase).ok());
    EXPECT_EQ(quotas.active_jobs(), 1u);
  }
  EXPECT_EQ(erased, 0);

  EXPECT_EQ(MetricValue(*metrics.collectable(), "gradcomp_jobs_held"), 1);
  EXPECT_EQ(MetricValue(*metrics.collectable(), "gradcomp_jobs_active"), 0);
  absl::StatusOr<ReleasedJob> released = quotas.Release("job", erase);
  ASSERT_TRUE(released.ok()) << released.status();
  EXPECT_EQ(MetricValue(*metrics.collectable(), "gradcomp_jobs_held"), 0);
  EXPECT_EQ(released->tensors, 2u);
  EXPECT_EQ(released->state_bytes, 120u);
  EXPECT_EQ(erased, 1);
  EXPECT_EQ(quotas.active_jobs(), 0u);
  EXPECT_EQ(Reduced(quotas, "job", "c", 8), 8);

  absl::StatusOr<ReleasedJob> unknown = quotas.Release("other", erase);
  ASSERT_TRUE(unknown.ok());
  EXPECT_EQ(unknown->tensors, 0u);
  EXPECT_EQ(erased, 2);
}

}  // namespace
}  // namespace gradcomp::service
