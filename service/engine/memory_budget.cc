#include "service/engine/memory_budget.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace gradcomp::service {
namespace {

constexpr absl::string_view kResource = "memory";

// The number in the first line of `path`; nullopt when the file is absent
// or says "max" (no limit).
std::optional<uint64_t> ReadLimit(const char* path) {
  std::ifstream in(path);
  std::string line;
  uint64_t value = 0;
  if (!std::getline(in, line) || !absl::SimpleAtoi(line, &value)) {
    return std::nullopt;
  }
  return value;
}

}  // namespace

MemoryBudget::Reservation::Reservation(Reservation&& other) noexcept
    : budget_(std::exchange(other.budget_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)) {}

MemoryBudget::Reservation& MemoryBudget::Reservation::operator=(
    Reservation&& other) noexcept {
  if (this != &other) {
    Release();
    budget_ = std::exchange(other.budget_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

absl::Status MemoryBudget::Reservation::GrowTo(uint64_t bytes,
                                               absl::string_view what,
                                               absl::Duration wait) {
  if (budget_ == nullptr) {
    return absl::FailedPreconditionError(
        "a reservation that belongs to no memory budget cannot grow");
  }
  if (bytes <= bytes_) return absl::OkStatus();
  const absl::Status grown = budget_->Acquire(bytes - bytes_, what, wait);
  if (grown.ok()) bytes_ = bytes;
  return grown;
}

void MemoryBudget::Reservation::ShrinkTo(uint64_t bytes) {
  if (bytes >= bytes_) return;
  if (budget_ != nullptr) budget_->Give(bytes_ - bytes);
  bytes_ = bytes;
}

void MemoryBudget::Reservation::Release() {
  if (budget_ != nullptr && bytes_ > 0) budget_->Give(bytes_);
  bytes_ = 0;
}

MemoryBudget::MemoryBudget(uint64_t total, Metrics* metrics)
    : total_(total), metrics_(metrics) {
  absl::MutexLock lock(&mu_);
  PublishLocked();
}

absl::StatusOr<MemoryBudget::Reservation> MemoryBudget::Reserve(
    uint64_t bytes, absl::string_view what, absl::Duration wait) {
  if (bytes > 0) {
    const absl::Status acquired = Acquire(bytes, what, wait);
    if (!acquired.ok()) return acquired;
  }
  return Reservation(this, bytes);
}

absl::Status MemoryBudget::Acquire(uint64_t bytes, absl::string_view what,
                                   absl::Duration wait) {
  absl::MutexLock lock(&mu_);
  auto fits = [this, bytes]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return FitsLocked(bytes);
  };
  // A request larger than the whole budget would wait for nothing.
  const bool can_ever_fit = bytes <= total_;
  auto await_room = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ++waiting_;
    const bool room = mu_.AwaitWithTimeout(absl::Condition(&fits), wait);
    --waiting_;
    return room;
  };
  if (can_ever_fit && (fits() || await_room())) {
    reserved_ += bytes;
    PublishLocked();
    return absl::OkStatus();
  }
  if (metrics_ != nullptr) metrics_->CountResourceExhausted(kResource);
  if (!can_ever_fit) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "memory budget: ", what, " needs ", bytes,
        " bytes, more than the whole budget of ", total_,
        " bytes; expected a smaller tensor or a larger --memory_budget_bytes"));
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "memory budget: ", what, " needs ", bytes, " bytes, but ",
      reserved_ + state_, " of the budget's ", total_, " bytes are in use (",
      state_, " by codec state) and none came free within ",
      absl::FormatDuration(wait),
      "; expected fewer or smaller tensors in flight, or a larger "
      "--memory_budget_bytes"));
}

bool MemoryBudget::FitsLocked(uint64_t bytes) const {
  const uint64_t used = reserved_ + state_;
  return used <= total_ && bytes <= total_ - used;
}

void MemoryBudget::Give(uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  reserved_ -= std::min(bytes, reserved_);
  PublishLocked();
}

void MemoryBudget::AddState(int64_t delta) {
  absl::MutexLock lock(&mu_);
  if (delta >= 0) {
    state_ += static_cast<uint64_t>(delta);
  } else {
    state_ -= std::min(static_cast<uint64_t>(-delta), state_);
  }
  PublishLocked();
}

absl::Status MemoryBudget::AddStateIfRoom(int64_t delta,
                                          absl::string_view what) {
  if (delta <= 0) {
    AddState(delta);
    return absl::OkStatus();
  }
  const uint64_t bytes = static_cast<uint64_t>(delta);
  absl::MutexLock lock(&mu_);
  if (FitsLocked(bytes)) {
    state_ += bytes;
    PublishLocked();
    return absl::OkStatus();
  }
  if (metrics_ != nullptr) metrics_->CountResourceExhausted(kResource);
  return absl::ResourceExhaustedError(
      absl::StrCat("memory budget: ", what, " needs ", bytes,
                   " more bytes, but ", reserved_ + state_, " of the budget's ",
                   total_, " bytes are in use (", state_,
                   " by codec state); expected a smaller import, or a larger "
                   "--memory_budget_bytes"));
}

uint64_t MemoryBudget::in_use() const {
  absl::MutexLock lock(&mu_);
  return reserved_ + state_;
}

uint64_t MemoryBudget::state_bytes() const {
  absl::MutexLock lock(&mu_);
  return state_;
}

int MemoryBudget::waiting() const {
  absl::MutexLock lock(&mu_);
  return waiting_;
}

void MemoryBudget::PublishLocked() {
  if (metrics_ != nullptr)
    metrics_->SetMemoryBudget(reserved_ + state_, total_);
}

uint64_t DefaultMemoryBudgetBytes() {
  uint64_t limit = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) *
                   static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  for (const char* path : {"/sys/fs/cgroup/memory.max",
                           "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    if (std::optional<uint64_t> cgroup = ReadLimit(path)) {
      limit = std::min(limit, *cgroup);
    }
  }
  return std::max<uint64_t>(limit / 2, 1);
}

}  // namespace gradcomp::service
