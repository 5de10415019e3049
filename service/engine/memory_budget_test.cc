#include "service/engine/memory_budget.h"

#include <thread>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/metrics/metrics.h"
#include "service/metrics/metrics_testing.h"

namespace gradcomp::service {
namespace {

using ::testing::HasSubstr;

double InUseGauge(const Metrics& metrics) {
  return MetricValue(*metrics.collectable(),
                     "gradcomp_memory_budget_in_use_bytes");
}

double Refusals(const Metrics& metrics) {
  return MetricValue(*metrics.collectable(),
                     "gradcomp_resource_exhausted_total",
                     {{"resource", "memory"}});
}

TEST(MemoryBudgetTest, ReserveAndReleaseByScope) {
  Metrics metrics(nullptr, "test");
  MemoryBudget budget(1000, &metrics);
  EXPECT_EQ(MetricValue(*metrics.collectable(), "gradcomp_memory_budget_bytes"),
            1000);
  {
    auto a = budget.Reserve(600, "a", absl::ZeroDuration());
    ASSERT_TRUE(a.ok()) << a.status();
    auto b = budget.Reserve(400, "b", absl::ZeroDuration());
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(budget.in_use(), 1000);
    EXPECT_EQ(InUseGauge(metrics), 1000);
    b->Release();
    EXPECT_EQ(budget.in_use(), 600);
  }
  EXPECT_EQ(budget.in_use(), 0);
  EXPECT_EQ(InUseGauge(metrics), 0);
}

TEST(MemoryBudgetTest, MovedReservationReleasesOnce) {
  MemoryBudget budget(100, nullptr);
  auto a = budget.Reserve(70, "a", absl::ZeroDuration());
  ASSERT_TRUE(a.ok());
  MemoryBudget::Reservation moved = std::move(*a);
  EXPECT_EQ(moved.bytes(), 70);
  MemoryBudget::Reservation other;
  other = std::move(moved);
  EXPECT_EQ(budget.in_use(), 70);
  other.Release();
  other.Release();
  EXPECT_EQ(budget.in_use(), 0);
}

TEST(MemoryBudgetTest, FullBudgetWaitsThenFailsNamingTheFigures) {
  Metrics metrics(nullptr, "test");
  MemoryBudget budget(1000, &metrics);
  auto held = budget.Reserve(900, "held", absl::ZeroDuration());
  ASSERT_TRUE(held.ok());
  auto refused = budget.Reserve(200, "tensor 'w'", absl::Milliseconds(20));
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("memory budget: tensor 'w' needs 200 bytes, but 900 "
                        "of the budget's 1000 bytes are in use"));
  EXPECT_EQ(Refusals(metrics), 1);
  // The refusal leaked nothing: what was held is all that is in use.
  EXPECT_EQ(budget.in_use(), 900);
  held->Release();
  EXPECT_EQ(budget.in_use(), 0);
  EXPECT_TRUE(budget.Reserve(1000, "all", absl::ZeroDuration()).ok());
}

TEST(MemoryBudgetTest, MoreThanTheWholeBudgetFailsAtOnce) {
  Metrics metrics(nullptr, "test");
  MemoryBudget budget(1000, &metrics);
  // An infinite wait would hang if the request waited for room.
  auto refused = budget.Reserve(1001, "huge", absl::InfiniteDuration());
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("more than the whole budget of 1000 bytes"));
  EXPECT_EQ(Refusals(metrics), 1);
  EXPECT_EQ(budget.in_use(), 0);
}

TEST(MemoryBudgetTest, WaiterGetsMemoryReleasedByAnother) {
  MemoryBudget budget(1000, nullptr);
  auto held = budget.Reserve(800, "held", absl::ZeroDuration());
  ASSERT_TRUE(held.ok());
  absl::StatusOr<MemoryBudget::Reservation> got;
  std::thread waiter(
      [&] { got = budget.Reserve(500, "waiter", absl::InfiniteDuration()); });
  // Released only once the waiter waits: a lost wake-up hangs the test.
  while (budget.waiting() != 1) absl::SleepFor(absl::Milliseconds(1));
  held->Release();
  waiter.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(budget.in_use(), 500);
}

TEST(MemoryBudgetTest, GrowToAddsOnlyTheDifferenceAndKeepsItOnFailure) {
  MemoryBudget budget(1000, nullptr);
  auto r = budget.Reserve(100, "r", absl::ZeroDuration());
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(r->GrowTo(600, "r", absl::ZeroDuration()).ok());
  EXPECT_EQ(r->bytes(), 600);
  EXPECT_EQ(budget.in_use(), 600);
  ASSERT_TRUE(r->GrowTo(300, "r", absl::ZeroDuration()).ok());
  EXPECT_EQ(r->bytes(), 600);
  EXPECT_EQ(r->GrowTo(1200, "r", absl::ZeroDuration()).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(r->bytes(), 600);
  EXPECT_EQ(budget.in_use(), 600);
  MemoryBudget::Reservation none;
  EXPECT_EQ(none.GrowTo(1, "none", absl::ZeroDuration()).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(MemoryBudgetTest, ShrinkToGivesBackOnlyWhatIsAbove) {
  MemoryBudget budget(1000, nullptr);
  auto r = budget.Reserve(600, "r", absl::ZeroDuration());
  ASSERT_TRUE(r.ok());
  r->ShrinkTo(800);  // never grows
  EXPECT_EQ(r->bytes(), 600);
  r->ShrinkTo(150);
  EXPECT_EQ(r->bytes(), 150);
  EXPECT_EQ(budget.in_use(), 150);
  r->Release();
  EXPECT_EQ(budget.in_use(), 0);
}

TEST(MemoryBudgetTest, CodecStateTakesRoomFromRequests) {
  MemoryBudget budget(1000, nullptr);
  budget.AddState(700);
  EXPECT_EQ(budget.state_bytes(), 700);
  auto refused = budget.Reserve(400, "r", absl::ZeroDuration());
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("(700 by codec state)"));
  budget.AddState(-500);
  EXPECT_TRUE(budget.Reserve(400, "r", absl::ZeroDuration()).ok());
  // More released than recorded clamps at zero rather than wrapping.
  budget.AddState(-5000);
  EXPECT_EQ(budget.state_bytes(), 0);
}

TEST(MemoryBudgetTest, DefaultIsHalfOfAvailableMemory) {
  const uint64_t physical = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) *
                            static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t budget = DefaultMemoryBudgetBytes();
  EXPECT_GT(budget, 0);
  EXPECT_LE(budget, physical / 2);
}

TEST(MemoryBudgetTest, StateAddedIfRoomIsRefusedWholeWhenItDoesNotFit) {
  MemoryBudget budget(1000, nullptr);
  budget.AddState(600);
  absl::Status refused = budget.AddStateIfRoom(401, "an import");
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(),
              HasSubstr("an import needs 401 more bytes, but 600 of the "
                        "budget's 1000 bytes are in use"));
  EXPECT_EQ(budget.state_bytes(), 600u);
  EXPECT_TRUE(budget.AddStateIfRoom(400, "an import").ok());
  EXPECT_EQ(budget.in_use(), 1000u);
  EXPECT_TRUE(budget.AddStateIfRoom(-300, "a smaller import").ok());
  EXPECT_EQ(budget.state_bytes(), 700u);
}

}  // namespace
}  // namespace gradcomp::service
