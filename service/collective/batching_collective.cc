#include "service/collective/batching_collective.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "base/blocking_wait.h"
#include "base/fnv1a.h"
#include "base/status_macros.h"
#include "codecs/wire.h"
#include "service/collective/gather_batch_message.h"

namespace gradcomp::service {
namespace {

std::string Prefix(const BatchSpec& batch, const RoundKey& key) {
  return absl::StrCat("batch '", batch.id, "' round ", key.round, ": ");
}

// Writes the value 1 as one element of `type` (little-endian), for the
// absence slots.
void WriteOne(codecs::ElemType type, char* out) {
  switch (type) {
    case codecs::ElemType::kF32: {
      const float one = 1.0f;
      std::memcpy(out, &one, sizeof(one));
      break;
    }
    case codecs::ElemType::kF16: {
      const uint16_t one = 0x3C00;
      std::memcpy(out, &one, sizeof(one));
      break;
    }
    case codecs::ElemType::kBF16: {
      const uint16_t one = 0x3F80;
      std::memcpy(out, &one, sizeof(one));
      break;
    }
  }
}

// What the members of a batch must agree on, read from one SUM payload.
// The parameter block too: a codec finishes a sum by its parameters
// (fp16's prescale divisor), so the members summed as one must share them.
struct BodyShape {
  codecs::CodecId codec;
  uint8_t round;
  uint64_t numel;
  codecs::ElemType type;
  size_t elements;
  absl::string_view params;  // a view of the payload, type byte first

  bool operator==(const BodyShape& o) const {
    return codec == o.codec && round == o.round && numel == o.numel &&
           type == o.type && elements == o.elements && params == o.params;
  }
  std::string ToString() const {
    return absl::StrCat("codec id ", static_cast<int>(codec), " round ", round,
                        ", ", numel, " elements, a body of ", elements,
                        " values of type ", static_cast<int>(type),
                        ", parameter block ", absl::BytesToHexString(params));
  }
};

// A SUM payload read in place: its parts (views of the payload) and the
// shape of its dense body.
struct SumBody {
  codecs::ParsedPayload parsed;
  BodyShape shape;
};

absl::StatusOr<SumBody> PeekSumBody(absl::string_view payload) {
  GC_ASSIGN_OR_RETURN(codecs::ParsedPayload parsed,
                      codecs::PeekPayload(payload));
  GC_ASSIGN_OR_RETURN(size_t elements, codecs::DenseBodyElements(parsed));
  const BodyShape shape{parsed.header.codec,
                        parsed.header.round,
                        parsed.header.numel,
                        static_cast<codecs::ElemType>(parsed.params[0]),
                        elements,
                        parsed.params};
  return SumBody{parsed, shape};
}

// Every rank's payload of one SUM member of a GATHER batch message, summed
// here in rank order (so identically on every rank). InvalidArgument naming
// the rank whose payload is not a dense body like rank 0's.
absl::StatusOr<codecs::RoundResult> SumGathered(
    const std::vector<codecs::Bytes>& payloads) {
  codecs::RoundResult result;
  result.world_size = static_cast<int>(payloads.size());
  std::optional<BodyShape> first;
  for (size_t r = 0; r < payloads.size(); ++r) {
    absl::StatusOr<SumBody> body = PeekSumBody(payloads[r]);
    if (!body.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", r, " sent a SUM round without a usable ",
                       "dense body: ", body.status().message()));
    }
    if (!first.has_value()) {
      first = body->shape;
      result.sum.assign(first->elements, 0.0f);
    } else if (!(body->shape == *first)) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", r, " sent ", body->shape.ToString(),
                       ", rank 0 ", first->ToString()));
    }
    GC_RETURN_IF_ERROR(
        codecs::AddDenseBody(body->parsed, 1.0f, absl::MakeSpan(result.sum)));
  }
  return result;
}

std::string BatchKey(absl::string_view id,
                     const std::vector<std::string>& members) {
  Fnv1a64 digest;
  for (const std::string& member : members) {
    digest.Update(member);
    digest.Update(absl::string_view("\0", 1));
  }
  return absl::StrCat("#batch:", id, "#",
                      absl::StrFormat("%016x", digest.value()));
}

}  // namespace

absl::StatusOr<BatchSpec> MakeBatchSpec(std::string id,
                                        std::vector<std::string> members) {
  if (id.empty()) {
    return absl::InvalidArgumentError(
        "batch id is empty, expected a name that is the same on every rank "
        "(such as 'bucket0:256x256')");
  }
  GC_RETURN_IF_ERROR(CheckNameLength("batch id", id));
  if (members.size() > kMaxBatchMembers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch '", id, "' has ", members.size(), " members, expected at most ",
        kMaxBatchMembers, " (each waiting member holds a daemon thread)"));
  }
  std::sort(members.begin(), members.end());
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i].empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "batch '", id, "' names an empty member, expected tensor names"));
    }
    if (i > 0 && members[i] == members[i - 1]) {
      return absl::InvalidArgumentError(
          absl::StrCat("batch '", id, "' names member '", members[i],
                       "' twice, expected each tensor once"));
    }
    if (absl::StrContains(members[i], '#')) {
      return absl::InvalidArgumentError(absl::StrCat(
          "batch '", id, "' names member '", members[i],
          "', which holds '#' (reserved for the daemon's own keys)"));
    }
  }
  std::string key = BatchKey(id, members);
  return BatchSpec{std::move(id), std::move(members), std::move(key)};
}

absl::Status CheckBatchMember(const BatchSpec& batch,
                              absl::string_view tensor) {
  if (std::binary_search(batch.members.begin(), batch.members.end(), tensor)) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "batch '", batch.id, "' does not name tensor '", tensor,
      "' among its members [", absl::StrJoin(batch.members, ", "),
      "], expected the members to include every tensor sent with it"));
}

BatchingCollective::BatchingCollective(Collective* inner,
                                       absl::Duration timeout)
    : inner_(inner), timeout_(timeout) {}

absl::StatusOr<codecs::RoundResult> BatchingCollective::Run(
    const RoundKey& key, codecs::Round round) {
  return inner_->Run(key, std::move(round));
}

absl::StatusOr<std::vector<codecs::Bytes>> BatchingCollective::AllToAll(
    const RoundKey& key, std::vector<codecs::Bytes> parts) {
  return inner_->AllToAll(key, std::move(parts));
}

absl::StatusOr<std::vector<codecs::Bytes>> BatchingCollective::Allgather(
    const RoundKey& key, codecs::Bytes part) {
  return inner_->Allgather(key, std::move(part));
}

absl::StatusOr<std::vector<codecs::Bytes>>
BatchingCollective::ExchangeWithNeighbours(const RoundKey& key,
                                           absl::Span<const int> neighbours,
                                           std::vector<codecs::Bytes> parts) {
  return inner_->ExchangeWithNeighbours(key, neighbours, std::move(parts));
}

bool BatchingCollective::Complete(const StepBatch& batch, int round,
                                  const RoundGroup& group) {
  for (size_t i = 0; i < batch.members.size(); ++i) {
    if (!group.arrived[i] && batch.left_from[i] > round) return false;
  }
  return true;
}

absl::StatusOr<BatchingCollective::StepBatch*> BatchingCollective::FindOrAdd(
    const RoundKey& key, const BatchSpec& batch) {
  StepKey step_key{key.job, batch.key, key.step};
  auto it = batches_.find(step_key);
  if (it == batches_.end()) {
    DropStale();
    StepBatch fresh;
    fresh.members = batch.members;
    fresh.left_from.assign(batch.members.size(), kStillIn);
    fresh.left_gather.assign(batch.members.size(), false);
    it = batches_.emplace(std::move(step_key), std::move(fresh)).first;
  }
  // The key holds a digest of the members; a collision is all this catches.
  if (it->second.members != batch.members) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch '", batch.id, "' step ", key.step, ": members [",
                     absl::StrJoin(batch.members, ", "), "] differ from [",
                     absl::StrJoin(it->second.members, ", "),
                     "] named by another member; expected one list"));
  }
  it->second.touched = absl::Now();
  return &it->second;
}

void BatchingCollective::DropStale() {
  const absl::Time cutoff = absl::Now() - 4 * timeout_;
  for (auto it = batches_.begin(); it != batches_.end();) {
    if (it->second.rounds.empty() && it->second.touched < cutoff) {
      it = batches_.erase(it);
    } else {
      ++it;
    }
  }
}

void BatchingCollective::MaybeErase(const RoundKey& key, const BatchSpec& batch,
                                    const StepBatch& step_batch) {
  if (!step_batch.rounds.empty()) return;
  for (int from : step_batch.left_from) {
    if (from == kStillIn) return;
  }
  batches_.erase(StepKey{key.job, batch.key, key.step});
}

// The members' common SUM plan: every arrived member sends a SUM round
// with the same body shape (say same-shape PowerSGD matrices), so their
// bodies sum as one vector of slots.
struct BatchingCollective::SumPlan {
  std::vector<codecs::ParsedPayload> parsed;  // per member; views of payloads
  BodyShape common;
};

std::optional<BatchingCollective::SumPlan> BatchingCollective::OneSumPlan(
    const std::vector<codecs::Bytes>& payloads,
    const std::vector<bool>& arrived, const std::vector<bool>& gather) {
  std::vector<codecs::ParsedPayload> parsed(payloads.size());
  std::optional<BodyShape> common;
  for (size_t i = 0; i < payloads.size(); ++i) {
    if (gather[i]) return std::nullopt;
    if (!arrived[i]) continue;
    absl::StatusOr<SumBody> body = PeekSumBody(payloads[i]);
    if (!body.ok() || (common.has_value() && !(body->shape == *common))) {
      return std::nullopt;
    }
    common = body->shape;
    parsed[i] = body->parsed;
  }
  if (!common.has_value()) return std::nullopt;
  return SumPlan{std::move(parsed), *common};
}

absl::StatusOr<BatchingCollective::Summed> BatchingCollective::Exchange(
    const RoundKey& key, const BatchSpec& batch, const SumPlan& plan,
    const std::vector<bool>& arrived) {
  const size_t members = batch.members.size();
  const BodyShape& common = plan.common;
  const size_t width = codecs::ElemTypeBytes(common.type);
  const size_t slot_bytes = common.elements * width;
  codecs::WireHeader header;
  header.codec = common.codec;
  header.round = common.round;
  header.flags = codecs::kFlagDenseBody;
  header.numel = common.numel * members;
  // The members' common parameter block, which the other ranks' must match.
  const std::string params(common.params);
  codecs::Round round;
  round.collective = codecs::Collective::kSum;
  char* body = codecs::BeginPayload(
      header, params, (common.elements + 1) * members * width, &round.payload);
  char* absence = body + slot_bytes * members;
  for (size_t i = 0; i < members; ++i) {
    if (arrived[i]) {
      std::memcpy(body + i * slot_bytes, plan.parsed[i].body.data(),
                  slot_bytes);
      std::memset(absence + i * width, 0, width);
    } else {
      std::memset(body + i * slot_bytes, 0, slot_bytes);
      WriteOne(common.type, absence + i * width);
    }
  }
  // Its own key: a rank where the batch's GATHER members all left would
  // otherwise meet the others' allgather with a sum.
  GC_ASSIGN_OR_RETURN(codecs::RoundResult result,
                      inner_->Run({key.job, absl::StrCat(batch.key, "#sum"),
                                   key.step, key.round},
                                  std::move(round)));
  if (result.sum.size() != (common.elements + 1) * members) {
    return absl::InternalError(
        absl::StrCat("the batch's sum holds ", result.sum.size(),
                     " values, expected ", (common.elements + 1) * members));
  }
  return Summed{result.world_size, common.elements, std::move(result.sum)};
}

absl::StatusOr<BatchingCollective::Gathered> BatchingCollective::ExchangeGather(
    const RoundKey& key, const BatchSpec& batch,
    std::vector<codecs::Bytes> payloads, const std::vector<bool>& arrived) {
  const size_t members = batch.members.size();
  codecs::Round round;
  round.collective = codecs::Collective::kGather;
  round.payload = GatherMessage(payloads, arrived);
  payloads.clear();
  GC_ASSIGN_OR_RETURN(
      codecs::RoundResult result,
      inner_->Run({key.job, batch.key, key.step, key.round}, std::move(round)));
  Gathered gathered;
  gathered.world_size = result.world_size;
  gathered.payloads.assign(members,
                           std::vector<codecs::Bytes>(result.payloads.size()));
  gathered.from.assign(members, 0);
  gathered.without.resize(members);
  std::vector<std::optional<codecs::Bytes>> split(members);
  for (size_t r = 0; r < result.payloads.size(); ++r) {
    std::fill(split.begin(), split.end(), std::nullopt);
    GC_RETURN_IF_ERROR(
        SplitGatherMessage(result.payloads[r], static_cast<int>(r), &split));
    result.payloads[r] = codecs::Bytes();
    for (size_t i = 0; i < members; ++i) {
      if (!split[i].has_value()) {
        gathered.without[i].push_back(static_cast<int>(r));
        continue;
      }
      gathered.payloads[i][r] = *std::move(split[i]);
      ++gathered.from[i];
    }
  }
  return gathered;
}

absl::StatusOr<codecs::RoundResult> BatchingCollective::RunBatched(
    const RoundKey& key, const BatchSpec& batch, codecs::Round round) {
  const auto member =
      std::lower_bound(batch.members.begin(), batch.members.end(), key.tensor);
  if (member == batch.members.end() || *member != key.tensor) {
    return absl::InvalidArgumentError(absl::StrCat(
        Prefix(batch, key), "tensor '", key.tensor, "' is not a member"));
  }
  const size_t index = member - batch.members.begin();
  const size_t members = batch.members.size();
  const absl::Time deadline = absl::Now() + timeout_;

  absl::MutexLock lock(&mu_);
  if (!shutdown_.ok()) return shutdown_;
  GC_ASSIGN_OR_RETURN(StepBatch * step_batch, FindOrAdd(key, batch));
  if (step_batch->left_from[index] <= key.round) {
    return absl::FailedPreconditionError(
        absl::StrCat(Prefix(batch, key), "tensor '", key.tensor,
                     "' left the batch at round ", step_batch->left_from[index],
                     " of step ", key.step));
  }
  RoundGroup& group =
      step_batch->rounds.try_emplace(key.round, members).first->second;
  if (group.arrived[index]) {
    return absl::InvalidArgumentError(absl::StrCat(
        Prefix(batch, key), "tensor '", key.tensor, "' reached step ", key.step,
        " round ", key.round, " twice, expected one reduce per step"));
  }
  group.arrived[index] = true;
  group.gather[index] = round.collective == codecs::Collective::kGather;
  group.payloads[index] = std::move(round.payload);
  ++group.waiting;

  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return group.finished || (!group.started && !shutdown_.ok()) ||
           (!group.started && Complete(*step_batch, key.round, group));
  };
  auto finished = [&] { return group.finished; };
  bool in_time = true;
  if (!ready()) {
    // The other members may be queued for this thread's pool: it starts
    // another thread for them while this one waits (base/blocking_wait.h).
    ScopedBlockingWait waiting_for_members;
    in_time = mu_.AwaitWithDeadline(
        absl::Condition(
            +[](decltype(ready)* f) { return (*f)(); }, &ready),
        deadline);
  }
  if (!group.finished && !group.started && !shutdown_.ok()) {
    // The daemon is stopping: the members that came fail, not waiting for
    // the rest.
    group.status = shutdown_;
    group.finished = true;
  } else if (!group.finished && !group.started && ready()) {
    // The last member to arrive (or the one woken by the last Leave) runs
    // the batch's one collective for everybody.
    group.started = true;
    std::vector<codecs::Bytes> payloads = std::move(group.payloads);
    const std::vector<bool> arrived = group.arrived;
    // The arrived members' kinds, and the GATHER ones' that left.
    std::vector<bool> gather = group.gather;
    for (size_t i = 0; i < members; ++i) {
      if (!arrived[i] && step_batch->left_gather[i]) gather[i] = true;
    }
    mu_.Unlock();
    absl::Status status;
    if (std::optional<SumPlan> plan = OneSumPlan(payloads, arrived, gather)) {
      absl::StatusOr<Summed> summed = Exchange(key, batch, *plan, arrived);
      mu_.Lock();
      if (summed.ok()) {
        group.world_size = summed->world_size;
        group.member_elements = summed->member_elements;
        group.sum = std::move(summed->sum);
      }
      status = summed.status();
    } else {
      // GATHER members, or SUM ones whose bodies differ (a top-k bucket's
      // biases sent dense, a tensor a codec sent dense this step): every
      // payload travels whole, and each SUM member sums its own. A large
      // SUM body goes alone instead (its size, and so this choice, is the
      // same on every rank).
      std::vector<bool> in_message = arrived;
      std::vector<codecs::Bytes> kept(members);
      for (size_t i = 0; i < members; ++i) {
        if (arrived[i] && !gather[i] &&
            payloads[i].size() > kMaxGatheredSumBytes) {
          in_message[i] = false;
          kept[i] = std::move(payloads[i]);
        }
      }
      absl::StatusOr<Gathered> gathered =
          ExchangeGather(key, batch, std::move(payloads), in_message);
      mu_.Lock();
      group.payloads = std::move(kept);
      for (size_t i = 0; i < members; ++i) {
        group.alone[i] = arrived[i] && !in_message[i];
      }
      if (gathered.ok()) {
        group.world_size = gathered->world_size;
        group.gathered = std::move(gathered->payloads);
        group.gathered_from = std::move(gathered->from);
        group.gathered_without = std::move(gathered->without);
      }
      status = gathered.status();
    }
    if (!status.ok()) {
      group.status = absl::Status(
          status.code(), absl::StrCat(Prefix(batch, key), status.message()));
    }
    group.finished = true;
  } else if (!group.finished && !group.started && !in_time) {
    std::vector<std::string> missing;
    for (size_t i = 0; i < members; ++i) {
      if (!group.arrived[i] && step_batch->left_from[i] > key.round) {
        missing.push_back(batch.members[i]);
      }
    }
    group.status = absl::DeadlineExceededError(absl::StrCat(
        Prefix(batch, key), "members [", absl::StrJoin(missing, ", "), "] of ",
        members, " neither reached step ", key.step, " round ", key.round,
        " nor left the batch within ", absl::FormatDuration(timeout_),
        " on rank ", inner_->rank(),
        " (their reduces never came or failed "
        "before the batch)"));
    group.finished = true;
  } else if (!group.finished) {
    // Another member runs the collective, which has its own deadline.
    ScopedBlockingWait waiting_for_collective;
    mu_.Await(absl::Condition(
        +[](decltype(finished)* f) { return (*f)(); }, &finished));
  }

  absl::StatusOr<codecs::RoundResult> result;
  if (!group.status.ok()) {
    result = group.status;
  } else if (group.alone[index]) {
    codecs::Round own;
    own.collective = codecs::Collective::kSum;
    own.payload = std::move(group.payloads[index]);
    mu_.Unlock();
    result = inner_->Run(key, std::move(own));
    mu_.Lock();
  } else if (!group.gathered.empty()) {
    const int from = group.gathered_from[index];
    if (from != group.world_size) {
      const std::vector<int>& without = group.gathered_without[index];
      result = absl::FailedPreconditionError(absl::StrCat(
          Prefix(batch, key), "tensor '", key.tensor, "' was gathered from ",
          from, " of ", group.world_size, " ranks; it left the batch on ",
          without.size() == 1 ? "rank " : "ranks ",
          absl::StrJoin(without, ", "), " (an error there)"));
    } else if (group.gather[index]) {
      codecs::RoundResult own;
      own.world_size = group.world_size;
      own.payloads = std::move(group.gathered[index]);
      result = std::move(own);
    } else {
      const std::vector<codecs::Bytes> payloads =
          std::move(group.gathered[index]);
      mu_.Unlock();
      result = SumGathered(payloads);
      mu_.Lock();
      if (!result.ok()) {
        result = absl::Status(
            result.status().code(),
            absl::StrCat(Prefix(batch, key), "tensor '", key.tensor,
                         "': ", result.status().message()));
      }
    }
  } else {
    const size_t n = group.member_elements;
    // Counted as absences, not presences: any count of 1 or more stays
    // non-zero in bf16 and fp16, where a count of presences would round
    // (257 ranks read as 256, as if one had left).
    const float absent = group.sum[members * n + index];
    if (absent != 0.0f) {
      result = absl::FailedPreconditionError(absl::StrCat(
          Prefix(batch, key), "tensor '", key.tensor, "' was in the sum of ",
          group.world_size - absent, " of ", group.world_size,
          " ranks; it left the batch on the others (an error there)"));
    } else {
      codecs::RoundResult own;
      own.world_size = group.world_size;
      own.sum.assign(group.sum.begin() + index * n,
                     group.sum.begin() + (index + 1) * n);
      result = std::move(own);
    }
  }
  if (--group.waiting == 0) {
    step_batch->rounds.erase(key.round);
    MaybeErase(key, batch, *step_batch);
  }
  return result;
}

void BatchingCollective::Shutdown(const absl::Status& why) {
  {
    absl::MutexLock lock(&mu_);
    shutdown_ = why;
  }
  inner_->Shutdown(why);
}

void BatchingCollective::ForgetJob(const std::string& job) {
  {
    absl::MutexLock lock(&mu_);
    for (auto it = batches_.lower_bound(
             StepKey{job, "", std::numeric_limits<int64_t>::min()});
         it != batches_.end() && std::get<0>(it->first) == job;) {
      // An open round has members in RunBatched, which hold the record.
      if (it->second.rounds.empty()) {
        it = batches_.erase(it);
      } else {
        ++it;
      }
    }
  }
  inner_->ForgetJob(job);
}

void BatchingCollective::Leave(const RoundKey& key, const BatchSpec& batch,
                               std::optional<codecs::Collective> kind) {
  const auto member =
      std::lower_bound(batch.members.begin(), batch.members.end(), key.tensor);
  if (member == batch.members.end() || *member != key.tensor) return;
  absl::MutexLock lock(&mu_);
  absl::StatusOr<StepBatch*> step_batch = FindOrAdd(key, batch);
  if (!step_batch.ok()) return;
  const size_t index = member - batch.members.begin();
  int& from = (*step_batch)->left_from[index];
  from = std::min(from, key.round);
  if (kind == codecs::Collective::kGather) {
    (*step_batch)->left_gather[index] = true;
  }
  MaybeErase(key, batch, **step_batch);
}

}  // namespace gradcomp::service
