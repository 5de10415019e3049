#include "service/collective/mailbox.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/blocking_wait.h"

namespace gradcomp::service {
namespace {

constexpr Phase kPhases[] = {Phase::kGather,      Phase::kReduceScatter,
                             Phase::kAllgather,   Phase::kShardScatter,
                             Phase::kShardGather, Phase::kNeighbours};

std::string PhaseName(Phase phase) {
  switch (phase) {
    case Phase::kGather:
      return "gather";
    case Phase::kReduceScatter:
      return "reduce-scatter";
    case Phase::kAllgather:
      return "allgather";
    case Phase::kShardScatter:
      return "shard-scatter";
    case Phase::kShardGather:
      return "shard-gather";
    case Phase::kNeighbours:
      return "neighbours";
  }
  return absl::StrCat("phase ", static_cast<int>(phase));
}

// The phases one collective goes through, numbered: a rank in one of them
// may get a faster peer's message of the next (a reduce-scatter's rank gets
// an allgather message), but never one of another collective's.
int CollectiveOf(Phase phase) {
  switch (phase) {
    case Phase::kGather:
      return 0;
    case Phase::kReduceScatter:
    case Phase::kAllgather:
      return 1;
    case Phase::kShardScatter:
    case Phase::kShardGather:
      return 2;
    case Phase::kNeighbours:
      return 3;
  }
  return -1;
}

// "tensor 't' step 3 round 0": the key but its job and phase.
std::string TensorRoundString(const MessageKey& key) {
  return absl::StrCat("tensor '", key.tensor, "' step ", key.step, " round ",
                      key.round);
}

// "job 'j' tensor 't' step 3 round 0": the key but its phase.
std::string RoundString(const MessageKey& key) {
  return absl::StrCat("job '", key.job, "' ", TensorRoundString(key));
}

std::string KeyString(const MessageKey& key) {
  return absl::StrCat(RoundString(key), " ", PhaseName(key.phase));
}

}  // namespace

Mailbox::Mailbox(int world_size, MailboxOptions options, PeerMetrics* metrics)
    : world_size_(world_size), options_(options), metrics_(metrics) {}

void Mailbox::CountDropped(absl::string_view reason) {
  if (metrics_ != nullptr) metrics_->CountDropped(reason);
}

void Mailbox::EraseLocked(absl::node_hash_map<MessageKey, Slot>::iterator it) {
  if (!it->second.claimed) unclaimed_bytes_ -= it->second.bytes;
  slots_.erase(it);
}

uint64_t Mailbox::SlotBytes(const MessageKey& key) const {
  // The node (key and slot) and its by-rank vector; a rough count, so that
  // slots of empty messages fill the cap too.
  return sizeof(MessageKey) + sizeof(Slot) + key.job.size() +
         key.tensor.size() +
         world_size_ * sizeof(std::optional<codecs::Bytes>) + 64;
}

absl::Status Mailbox::OverflowError(int from, const MessageKey& key,
                                    uint64_t bytes) const {
  return absl::ResourceExhaustedError(absl::StrCat(
      "the message of rank ", from, " for ", KeyString(key), " (", bytes,
      " bytes) came before this rank's call and did not fit in the ",
      options_.max_unclaimed_bytes,
      " bytes held for early messages; expected ranks to reach tensors "
      "closer together, or a larger peer buffer"));
}

absl::Status Mailbox::OverflowError(const MessageKey& key,
                                    const Overflow& overflow) const {
  if (!overflow.corrupt)
    return OverflowError(overflow.from, key, overflow.bytes);
  return absl::DataLossError(absl::StrCat(
      "the message of rank ", overflow.from, " for ", KeyString(key),
      " came before this rank's call and arrived corrupt; it was dropped, "
      "and its error with it, since the ",
      options_.max_unclaimed_bytes,
      " bytes held for early messages were full (counted in "
      "gradcomp_peer_messages_dropped_total)"));
}

Mailbox::Slot* Mailbox::ArrivalSlotLocked(const MessageKey& key, absl::Time now,
                                          int from, uint64_t message_bytes,
                                          bool corrupt) {
  auto current = current_step_.find(TensorKey(key.job, key.tensor));
  if (current != current_step_.end() && key.step < current->second.step) {
    CountDropped("stale");
    return nullptr;
  }
  if (auto it = slots_.find(key); it != slots_.end()) return &it->second;
  // A new slot, unclaimed: it counts against the cap with its key, so that
  // a peer sending empty messages under ever new names (or news of corrupt
  // ones) cannot hold memory beyond it. One that does not fit is dropped
  // without a slot, and recorded while there is room for the record: its
  // collective, if any comes, fails at once saying so.
  const uint64_t bytes = SlotBytes(key);
  if (unclaimed_bytes_ + bytes > options_.max_unclaimed_bytes) {
    CountDropped("overflow");
    auto [it, inserted] = overflows_.try_emplace(key);
    if (inserted && overflow_bytes_ + OverflowBytes(key) > kMaxOverflowBytes) {
      overflows_.erase(it);
    } else {
      if (inserted) overflow_bytes_ += OverflowBytes(key);
      it->second = Overflow{from, message_bytes, now, corrupt};
    }
    return nullptr;
  }
  Slot& slot = SlotLocked(key, now);
  slot.bytes = bytes;
  unclaimed_bytes_ += bytes;
  return &slot;
}

Mailbox::Slot& Mailbox::SlotLocked(const MessageKey& key, absl::Time now) {
  auto [it, inserted] = slots_.try_emplace(key);
  if (inserted) {
    it->second.by_rank.resize(world_size_);
    it->second.created = now;
  }
  return it->second;
}

void Mailbox::EraseOverflowsLocked(
    const std::function<bool(const MessageKey&, const Overflow&)>& drop) {
  for (auto it = overflows_.begin(); it != overflows_.end();) {
    auto next = std::next(it);
    if (drop(it->first, it->second)) EraseOverflowLocked(it);
    it = next;
  }
}

void Mailbox::EraseOverflowLocked(
    absl::flat_hash_map<MessageKey, Overflow>::iterator it) {
  overflow_bytes_ -= OverflowBytes(it->first);
  overflows_.erase(it);
}

void Mailbox::ExpireDueLocked(absl::Time now) {
  if (now < next_expiry_) return;
  next_expiry_ = now + options_.unclaimed_ttl / 4;
  const absl::Time cutoff = now - options_.unclaimed_ttl;
  for (auto it = slots_.begin(); it != slots_.end();) {
    auto next = std::next(it);
    if (!it->second.claimed && it->second.created < cutoff) {
      CountDropped("expired");
      EraseLocked(it);
    }
    it = next;
  }
  EraseOverflowsLocked([cutoff](const MessageKey&, const Overflow& overflow) {
    return overflow.at < cutoff;
  });
  absl::erase_if(current_step_, [cutoff](const auto& entry) {
    return entry.second.begun < cutoff;
  });
}

void Mailbox::OnMessage(int from, const MessageKey& key, codecs::Bytes data) {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  ExpireDueLocked(now);
  Slot* const arrival = ArrivalSlotLocked(key, now, from, data.size());
  if (arrival == nullptr) return;
  Slot& slot = *arrival;
  std::optional<codecs::Bytes>& entry = slot.by_rank[from];
  if (!slot.claimed) {
    // A peer that restarted may send a key again: the newer copy wins.
    const uint64_t replaced = entry.has_value() ? entry->size() : 0;
    if (unclaimed_bytes_ - replaced + data.size() >
        options_.max_unclaimed_bytes) {
      CountDropped("overflow");
      slot.error = OverflowError(from, key, data.size());
      return;
    }
    unclaimed_bytes_ += data.size() - replaced;
    slot.bytes += data.size() - replaced;
  }
  entry = std::move(data);
  ++slot.arrivals;
  MarkOtherCollectiveLocked(from, key);
}

void Mailbox::MarkOtherCollectiveLocked(int from, const MessageKey& key) {
  MessageKey other = key;
  for (Phase phase : kPhases) {
    if (CollectiveOf(phase) == CollectiveOf(key.phase)) continue;
    other.phase = phase;
    auto it = slots_.find(other);
    if (it == slots_.end()) continue;
    Slot& slot = it->second;
    if (slot.claimed && slot.other_from < 0) {
      slot.other_from = from;
      slot.other_phase = key.phase;
      ++slot.arrivals;
    }
  }
}

void Mailbox::OnCorruptMessage(int from, const MessageKey& key,
                               const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  // Kept until this rank's call for the key collects it, like a message.
  Slot* const slot =
      ArrivalSlotLocked(key, absl::Now(), from, 0, /*corrupt=*/true);
  if (slot == nullptr) return;
  if (slot->error.ok()) slot->error = why;
  ++slot->arrivals;
}

void Mailbox::OnPeerLost(int rank, const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  for (auto& [key, slot] : slots_) {
    if (slot.claimed && slot.awaited[rank] && !slot.by_rank[rank].has_value() &&
        slot.error.ok()) {
      slot.error = absl::UnavailableError(absl::StrCat(
          "rank ", rank, " was lost before it sent its message for ",
          KeyString(key), ": ", why.message()));
    }
  }
}

void Mailbox::Close(const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  closed_ = why;
  for (auto& [key, slot] : slots_) {
    if (slot.claimed && slot.error.ok()) slot.error = why;
  }
}

void Mailbox::ForgetJob(const std::string& job) {
  absl::MutexLock lock(&mu_);
  absl::erase_if(current_step_, [&job](const auto& entry) {
    return entry.first.first == job;
  });
  EraseOverflowsLocked([&job](const MessageKey& key, const Overflow&) {
    return key.job == job;
  });
  for (auto it = slots_.begin(); it != slots_.end();) {
    auto next = std::next(it);
    if (it->first.job == job && !it->second.claimed) EraseLocked(it);
    it = next;
  }
}

void Mailbox::BeginStep(const std::string& job, const std::string& tensor,
                        int64_t step) {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  ExpireDueLocked(now);
  current_step_[TensorKey(job, tensor)] = CurrentStep{step, now};
  for (auto it = slots_.begin(); it != slots_.end();) {
    auto next = std::next(it);
    const MessageKey& key = it->first;
    if (!it->second.claimed && key.step < step && key.tensor == tensor &&
        key.job == job) {
      CountDropped("stale");
      EraseLocked(it);
    }
    it = next;
  }
  EraseOverflowsLocked([&](const MessageKey& key, const Overflow&) {
    return key.step < step && key.tensor == tensor && key.job == job;
  });
}

absl::StatusOr<std::vector<codecs::Bytes>> Mailbox::Collect(
    const MessageKey& key, absl::Span<const int> from, absl::Time deadline,
    const std::function<std::string(int)>& peer_name) {
  absl::MutexLock lock(&mu_);
  if (!closed_.ok()) return closed_;
  const absl::Time now = absl::Now();
  ExpireDueLocked(now);
  Slot& slot = SlotLocked(key, now);
  if (slot.claimed) {
    return absl::FailedPreconditionError(
        absl::StrCat(KeyString(key),
                     " is already being collected by another call on this "
                     "rank; expected one call per tensor and step"));
  }
  slot.claimed = true;
  unclaimed_bytes_ -= slot.bytes;
  slot.bytes = 0;
  slot.awaited.assign(world_size_, false);
  for (int rank : from) slot.awaited[rank] = true;
  if (auto dropped = overflows_.find(key); dropped != overflows_.end()) {
    if (slot.error.ok()) {
      slot.error = OverflowError(key, dropped->second);
    }
    EraseOverflowLocked(dropped);
  }

  // The ranks still missing, mirrored into the waiting gauges.
  std::vector<int> waiting;
  auto update_waiting = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<int> missing;
    for (int rank : from) {
      if (!slot.by_rank[rank].has_value()) missing.push_back(rank);
    }
    if (metrics_ != nullptr) {
      for (int rank : waiting) metrics_->AddWaiting(rank, -1);
      for (int rank : missing) metrics_->AddWaiting(rank, 1);
    }
    waiting = std::move(missing);
  };
  update_waiting();
  bool timed_out = false;
  // Marked once this thread does wait: a pool running it may start another
  // for its queued tensors meanwhile (base/blocking_wait.h).
  std::optional<ScopedBlockingWait> blocked;
  while (!waiting.empty() && slot.error.ok() && slot.other_from < 0 &&
         !timed_out) {
    if (!blocked.has_value()) blocked.emplace();
    const int seen = slot.arrivals;
    auto progress = [&slot, seen]() {
      return slot.arrivals != seen || !slot.error.ok();
    };
    timed_out = !mu_.AwaitWithDeadline(absl::Condition(&progress), deadline);
    update_waiting();
  }
  blocked.reset();
  std::vector<int> missing = waiting;
  if (metrics_ != nullptr) {
    for (int rank : waiting) metrics_->AddWaiting(rank, -1);
  }
  absl::Status error = slot.error;
  if (error.ok() && slot.other_from >= 0) {
    error = absl::FailedPreconditionError(absl::StrCat(
        peer_name(slot.other_from), " sent a ", PhaseName(slot.other_phase),
        " message for ", RoundString(key), ", where this rank waits for ",
        PhaseName(key.phase),
        ": the ranks reduce this tensor with collectives of different kinds "
        "(a codec or mode that differs between ranks, such as a summable "
        "codec on one and a compressing one on another); expected the same "
        "on every rank"));
  }
  std::vector<codecs::Bytes> out(world_size_);
  for (int rank : from) {
    if (slot.by_rank[rank].has_value())
      out[rank] = std::move(*slot.by_rank[rank]);
  }
  // Erased by key: waiting let other calls rehash the map, which
  // invalidates iterators (the node, and `slot`, stay put).
  slots_.erase(key);
  if (!error.ok()) return error;
  if (!missing.empty()) {
    std::vector<std::string> names;
    for (int rank : missing) names.push_back(peer_name(rank));
    std::vector<int> arrived;
    for (int rank : from) {
      if (std::find(missing.begin(), missing.end(), rank) == missing.end()) {
        arrived.push_back(rank);
      }
    }
    return absl::DeadlineExceededError(absl::StrCat(
        KeyString(key), ": no message from ", absl::StrJoin(names, ", "),
        " before the deadline (", arrived.empty() ? "none" : "ranks ",
        absl::StrJoin(arrived, ", "), arrived.empty() ? " of the others" : "",
        " arrived)", SentInsteadLocked(key.job, missing, peer_name)));
  }
  return out;
}

std::string Mailbox::SentInsteadLocked(
    const std::string& job, absl::Span<const int> ranks,
    const std::function<std::string(int)>& peer_name) const {
  constexpr int kMaxKeysPerRank = 3;
  std::string out;
  for (int rank : ranks) {
    std::vector<std::string> keys;
    for (const auto& [key, slot] : slots_) {
      if (key.job == job && !slot.claimed && slot.by_rank[rank].has_value() &&
          keys.size() < kMaxKeysPerRank) {
        keys.push_back(
            absl::StrCat(TensorRoundString(key), " ", PhaseName(key.phase)));
      }
    }
    if (keys.empty()) continue;
    std::sort(keys.begin(), keys.end());
    absl::StrAppend(&out, "; ", peer_name(rank),
                    " sent instead: ", absl::StrJoin(keys, ", "));
  }
  return out;
}

uint64_t Mailbox::unclaimed_bytes() const {
  absl::MutexLock lock(&mu_);
  return unclaimed_bytes_;
}

}  // namespace gradcomp::service
