#include "service/collective/peer_collective.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "base/seconds_since.h"
#include "base/status_macros.h"
#include "codecs/wire.h"
#include "service/collective/slice.h"

namespace gradcomp::service {

// Names in keys are a client's (at most kMaxNameBytes) or a batch's key,
// its id in a frame of a few dozen bytes: the peers must accept them.
static_assert(kMaxNameBytes + 128 <= kMaxPeerNameBytes);
namespace {

using Clock = std::chrono::steady_clock;

MessageKey ToMessageKey(const RoundKey& key, Phase phase) {
  return MessageKey{key.job, key.tensor, key.step, key.round, phase};
}

bool IsF32Body(const codecs::ParsedPayload& part) {
  return static_cast<codecs::ElemType>(part.params[0]) ==
         codecs::ElemType::kF32;
}

// InvalidArgument unless `part` has a dense body of `expected` elements.
absl::Status CheckDenseBody(const codecs::ParsedPayload& part,
                            size_t expected) {
  GC_ASSIGN_OR_RETURN(const size_t n, codecs::DenseBodyElements(part));
  if (n != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected a dense body of ", expected, " elements, got ",
                     n, " (", part.body.size(), " bytes)"));
  }
  return absl::OkStatus();
}

// Writes the out.size() elements of `part`'s dense body, as fp32, over
// `out`: fp32 bodies copied, fp16 and bf16 ones added onto zeros.
absl::Status WriteDenseBody(const codecs::ParsedPayload& part,
                            absl::Span<float> out) {
  GC_RETURN_IF_ERROR(CheckDenseBody(part, out.size()));
  if (IsF32Body(part)) {
    if (!out.empty()) {
      std::memcpy(out.data(), part.body.data(), out.size() * sizeof(float));
    }
    return absl::OkStatus();
  }
  std::fill(out.begin(), out.end(), 0.0f);
  return codecs::AddDenseBody(part, 1.0f, out);
}

// Appends the `expected` elements of `part`'s dense body, as fp32, to `out`.
// fp32 bodies are copied, never zero-filled first (the body lies at an odd
// offset in its message, so it goes through a small aligned block that
// std::vector::insert copies from); fp16 and bf16 ones are added onto zeros.
// Sums built this way need no zeroed accumulator, which for a 100 MB tensor
// was a memset over fresh pages per step.
absl::Status AppendDenseBody(const codecs::ParsedPayload& part, size_t expected,
                             std::vector<float>* out) {
  GC_RETURN_IF_ERROR(CheckDenseBody(part, expected));
  const size_t n = expected;
  if (IsF32Body(part)) {
    constexpr size_t kBlock = 1024;
    float block[kBlock];
    for (size_t i = 0; i < n; i += kBlock) {
      const size_t k = std::min(kBlock, n - i);
      std::memcpy(block, part.body.data() + i * sizeof(float),
                  k * sizeof(float));
      out->insert(out->end(), block, block + k);
    }
    return absl::OkStatus();
  }
  const size_t old = out->size();
  out->resize(old + n);
  return codecs::AddDenseBody(part, 1.0f, absl::MakeSpan(*out).subspan(old));
}

// The dense element type an owner sends its summed slice in: the
// payload's own, unless a sum does not fit it (fp16 overflows at 65520),
// then fp32, so that a finite sum never turns into Inf.
codecs::ElemType SumType(codecs::ElemType body, absl::Span<const float> sum) {
  float limit;
  switch (body) {
    case codecs::ElemType::kF16:
      limit = 65504.0f;
      break;
    case codecs::ElemType::kBF16:
      limit = 3.38953139e38f;
      break;
    default:
      return body;
  }
  for (float v : sum) {
    if (std::isfinite(v) && std::fabs(v) > limit) return codecs::ElemType::kF32;
  }
  return body;
}

// Calls send(to) for every rank in `ranks`, all of them even after one
// fails, and returns the first error. A rank that cannot take its message
// (unreachable: the in-process and NCCL transports refuse at once) must not
// keep this rank's message from the ranks after it: their collectives would
// wait for it until their deadlines and then name this healthy rank as
// missing.
template <typename Send>
absl::Status SendToEach(absl::Span<const int> ranks, Send send) {
  absl::Status first;
  for (int to : ranks) first.Update(send(to));
  return first;
}

}  // namespace

PeerCollective::PeerCollective(Transport* transport, Mailbox* mailbox,
                               PeerCollectiveOptions options,
                               PeerMetrics* metrics)
    : transport_(transport),
      mailbox_(mailbox),
      options_(options),
      metrics_(metrics) {
  const int w = transport_->world_size();
  for (int i = 1; i < w; ++i) others_.push_back((transport_->rank() + i) % w);
}

absl::Status PeerCollective::SendToOthers(
    const MessageKey& key, std::shared_ptr<const codecs::Bytes> data,
    absl::Time deadline) {
  // One message, copied for each peer: the copies share its chunk checksums.
  const OutgoingMessage message = OutgoingMessage::Of(std::move(data));
  return SendToEach(others_, [&](int to) {
    return transport_->SendMessage(to, key, message, deadline);
  });
}

absl::StatusOr<std::vector<codecs::Bytes>> PeerCollective::CollectFromOthers(
    const MessageKey& key, absl::Time deadline) {
  return mailbox_->Collect(key, others_, deadline,
                           [this](int r) { return transport_->PeerName(r); });
}

absl::StatusOr<codecs::RoundResult> PeerCollective::Run(const RoundKey& key,
                                                        codecs::Round round) {
  const Clock::time_point start = Clock::now();
  const absl::Time deadline = absl::Now() + options_.timeout;
  mailbox_->BeginStep(key.job, key.tensor, key.step);
  const bool gather = round.collective == codecs::Collective::kGather;
  const Algorithm algorithm =
      gather ? Algorithm::kAllgather : Algorithm::kReduceScatterAllgather;
  absl::StatusOr<codecs::RoundResult> result;
  if (gather) {
    absl::StatusOr<std::vector<codecs::Bytes>> payloads = AllgatherPhase(
        ToMessageKey(key, Phase::kGather), std::move(round.payload), deadline);
    if (payloads.ok()) {
      result.emplace();
      result->world_size = world_size();
      result->payloads = *std::move(payloads);
    } else {
      result = payloads.status();
    }
  } else {
    result = ReduceScatterAllgather(
        key, std::make_shared<const codecs::Bytes>(std::move(round.payload)),
        round.sum_into, deadline);
  }
  if (!result.ok()) {
    WithdrawQueued(key);
  } else if (metrics_ != nullptr) {
    metrics_->ObserveCollective(algorithm, SecondsSince(start));
  }
  return result;
}

void PeerCollective::WithdrawQueued(const RoundKey& key) {
  transport_->Withdraw(key.job, key.tensor, key.step, key.round);
}

absl::StatusOr<std::vector<codecs::Bytes>> PeerCollective::AllgatherPhase(
    const MessageKey& key, codecs::Bytes payload, absl::Time deadline) {
  auto own = std::make_shared<const codecs::Bytes>(std::move(payload));
  GC_RETURN_IF_ERROR(SendToOthers(key, own, deadline));
  GC_ASSIGN_OR_RETURN(std::vector<codecs::Bytes> payloads,
                      CollectFromOthers(key, deadline));
  payloads[rank()] = *own;
  return payloads;
}

absl::StatusOr<std::vector<codecs::Bytes>> PeerCollective::AllToAll(
    const RoundKey& key, std::vector<codecs::Bytes> parts) {
  const Clock::time_point start = Clock::now();
  const absl::Time deadline = absl::Now() + options_.timeout;
  if (parts.size() != static_cast<size_t>(world_size())) {
    return absl::InternalError(absl::StrCat(
        "tensor '", key.tensor, "' step ", key.step, ": ", parts.size(),
        " parts for an all-to-all, expected one per rank (", world_size(),
        ")"));
  }
  mailbox_->BeginStep(key.job, key.tensor, key.step);
  bool done = false;
  const absl::Cleanup withdraw = [&] {
    if (!done) WithdrawQueued(key);
  };
  const MessageKey message = ToMessageKey(key, Phase::kShardScatter);
  GC_RETURN_IF_ERROR(SendToEach(others_, [&](int to) {
    return transport_->Send(
        to, message,
        std::make_shared<const codecs::Bytes>(std::move(parts[to])), deadline);
  }));
  GC_ASSIGN_OR_RETURN(std::vector<codecs::Bytes> got,
                      CollectFromOthers(message, deadline));
  got[rank()] = std::move(parts[rank()]);
  done = true;
  if (metrics_ != nullptr) {
    metrics_->ObserveCollective(Algorithm::kAllToAll, SecondsSince(start));
  }
  return got;
}

absl::StatusOr<std::vector<codecs::Bytes>> PeerCollective::Allgather(
    const RoundKey& key, codecs::Bytes part) {
  const Clock::time_point start = Clock::now();
  const absl::Time deadline = absl::Now() + options_.timeout;
  mailbox_->BeginStep(key.job, key.tensor, key.step);
  absl::StatusOr<std::vector<codecs::Bytes>> got = AllgatherPhase(
      ToMessageKey(key, Phase::kShardGather), std::move(part), deadline);
  if (!got.ok()) {
    WithdrawQueued(key);
    return got;
  }
  if (metrics_ != nullptr) {
    metrics_->ObserveCollective(Algorithm::kAllgather, SecondsSince(start));
  }
  return got;
}

absl::StatusOr<codecs::RoundResult> PeerCollective::ReduceScatterAllgather(
    const RoundKey& key, std::shared_ptr<const codecs::Bytes> payload,
    absl::Span<float> sum_into, absl::Time deadline) {
  const int w = world_size();
  const int me = rank();
  GC_ASSIGN_OR_RETURN(const codecs::ParsedPayload own,
                      codecs::PeekPayload(*payload));
  if ((own.header.flags & codecs::kFlagDenseBody) == 0 || own.params.empty()) {
    return absl::InternalError(
        absl::StrCat("round ", key.round,
                     ": a SUM round's payload has no dense body (flags ",
                     own.header.flags, ")"));
  }
  const auto elem_type = static_cast<codecs::ElemType>(own.params[0]);
  const size_t elem = codecs::ElemTypeBytes(elem_type);
  if (elem == 0 || own.body.size() % elem != 0) {
    return absl::InternalError(
        absl::StrCat("round ", key.round, ": dense body of ", own.body.size(),
                     " bytes is not a whole number of elements of type ",
                     static_cast<int>(elem_type)));
  }
  const uint64_t m = own.body.size() / elem;
  codecs::WireHeader header = own.header;
  header.flags = codecs::kFlagDenseBody;

  // Reduce-scatter: slice j of this rank's body goes to rank j, as it is:
  // a small header of its own with the payload's whole parameter block,
  // then the body's bytes where they lie. The owner sums only slices whose
  // blocks match its own: a codec finishes a sum by its parameters (fp16's
  // prescale divisor), so ranks that differ in them would each return
  // another result.
  const MessageKey scatter = ToMessageKey(key, Phase::kReduceScatter);
  GC_RETURN_IF_ERROR(SendToEach(others_, [&](int to) {
    const Slice s = SliceOf(m, w, to);
    auto head = std::make_shared<const codecs::Bytes>(
        codecs::PayloadHead(header, own.params, s.size * elem));
    OutgoingMessage message;
    message.parts = {*head, own.body.substr(s.begin * elem, s.size * elem)};
    message.owner =
        std::make_shared<std::pair<std::shared_ptr<const codecs::Bytes>,
                                   std::shared_ptr<const codecs::Bytes>>>(
            std::move(head), payload);
    return transport_->SendMessage(to, scatter, std::move(message), deadline);
  }));
  GC_ASSIGN_OR_RETURN(std::vector<codecs::Bytes> got,
                      CollectFromOthers(scatter, deadline));

  // This rank's slice: the W contributions added in fp32 in rank order,
  // whatever order they arrived in, so the sum is the same on every rank.
  // Rank 0's is copied, the others added to it. When the result goes into
  // `sum_into`, the slice is summed where it ends up (no slice-sized
  // buffer, and no copy back from the bytes this rank sends); otherwise in
  // uninitialised scratch.
  const bool in_place = sum_into.size() == m;
  const Slice mine = SliceOf(m, w, me);
  auto reduced = std::make_shared<codecs::Bytes>();
  codecs::ElemType sent_type = elem_type;
  {
    std::unique_ptr<float[]> scratch;
    absl::Span<float> sum;
    if (in_place) {
      sum = sum_into.subspan(mine.begin, mine.size);
    } else {
      scratch.reset(new float[mine.size]);
      sum = absl::MakeSpan(scratch.get(), mine.size);
    }
    for (int r = 0; r < w; ++r) {
      absl::StatusOr<codecs::ParsedPayload> part;
      if (r == me) {
        part = own;
        part->body = own.body.substr(mine.begin * elem, mine.size * elem);
      } else {
        part = codecs::PeekPayload(got[r]);
      }
      absl::Status status = part.status();
      if (status.ok() && (part->header.codec != header.codec ||
                          part->header.round != header.round)) {
        status = absl::InvalidArgumentError(
            absl::StrCat("rank ", r, " encoded codec id ",
                         static_cast<int>(part->header.codec), " round ",
                         static_cast<int>(part->header.round), ", rank ", me,
                         " encoded codec id ", static_cast<int>(header.codec),
                         " round ", static_cast<int>(header.round),
                         "; expected the same policy on every rank"));
      } else if (status.ok() && part->params != own.params) {
        status = absl::InvalidArgumentError(absl::StrCat(
            "rank ", r, " encoded codec id ", static_cast<int>(header.codec),
            " with parameter block ", absl::BytesToHexString(part->params),
            ", rank ", me, " with ", absl::BytesToHexString(own.params),
            "; expected the same codec parameters on every rank (a request "
            "that names its codec must name the same on every rank)"));
      }
      if (status.ok()) {
        status = r == 0 ? WriteDenseBody(*part, sum)
                        : codecs::AddDenseBody(*part, 1.0f, sum);
      }
      if (!status.ok()) {
        return absl::Status(
            status.code(),
            absl::StrCat("reduce-scatter slice ", me, " from rank ", r, ": ",
                         status.message()));
      }
      if (r != me) got[r] = codecs::Bytes();  // freed as soon as added
    }
    sent_type = SumType(elem_type, sum);
    codecs::WriteDensePayload(header, sent_type, sum, reduced.get());
  }
  // The encoded tensor is needed no more here (the slices still on their
  // way to the other ranks hold it): freed before the allgather's wait
  // rather than after, so that the many tensors of a step in flight at once
  // do not each keep theirs, and the heap grows into fewer fresh pages.
  payload.reset();

  // Allgather of the summed slices. The result is put together once they
  // have all come, from the bytes each owner sent (this rank's too), so
  // every rank decodes exactly the same values, and it is not allocated
  // (nor zero-filled) while this rank waits. Written straight into the
  // caller's `sum_into` when that fits: no tensor-sized vector to fill and
  // read back.
  const MessageKey gather = ToMessageKey(key, Phase::kAllgather);
  GC_RETURN_IF_ERROR(SendToOthers(gather, reduced, deadline));
  GC_ASSIGN_OR_RETURN(got, CollectFromOthers(gather, deadline));
  codecs::RoundResult result;
  result.world_size = w;
  if (in_place) {
    result.summed_into = sum_into;
  } else {
    result.sum.reserve(m);
  }
  for (int r = 0; r < w; ++r) {
    // Sent as fp32, this rank's slice is already in `sum_into` exactly as
    // the others decode it; a narrower type is written back rounded, as
    // they see it.
    if (r == me && in_place && sent_type == codecs::ElemType::kF32) continue;
    absl::StatusOr<codecs::ParsedPayload> part =
        codecs::PeekPayload(r == me ? *reduced : got[r]);
    absl::Status status = part.status();
    const Slice s = SliceOf(m, w, r);
    if (status.ok()) {
      status = in_place
                   ? WriteDenseBody(*part, sum_into.subspan(s.begin, s.size))
                   : AppendDenseBody(*part, s.size, &result.sum);
    }
    if (!status.ok()) {
      return absl::Status(status.code(),
                          absl::StrCat("summed slice ", r, " from rank ", r,
                                       ": ", status.message()));
    }
    got[r] = codecs::Bytes();
  }
  return result;
}

// --- Gossip (service/gossip/): the neighbour exchange of NEIGHBOURS rounds.
// Each part goes to its neighbour only; the deadline and the missing-rank
// errors are Allgather's (the mailbox's Collect names the ranks).
absl::StatusOr<std::vector<codecs::Bytes>>
PeerCollective::ExchangeWithNeighbours(const RoundKey& key,
                                       absl::Span<const int> neighbours,
                                       std::vector<codecs::Bytes> parts) {
  const Clock::time_point start = Clock::now();
  const absl::Time deadline = absl::Now() + options_.timeout;
  if (parts.size() != neighbours.size()) {
    return absl::InternalError(absl::StrCat(
        "tensor '", key.tensor, "' step ", key.step, ": ", parts.size(),
        " parts for ", neighbours.size(), " neighbours; expected one each"));
  }
  std::vector<bool> seen(world_size(), false);
  for (int n : neighbours) {
    if (n < 0 || n >= world_size() || n == rank() || seen[n]) {
      return absl::InternalError(absl::StrCat(
          "tensor '", key.tensor, "' step ", key.step, ": neighbour ", n,
          " of rank ", rank(), " is out of [0, ", world_size(),
          "), this rank, or listed twice"));
    }
    seen[n] = true;
  }
  mailbox_->BeginStep(key.job, key.tensor, key.step);
  bool done = false;
  const absl::Cleanup withdraw = [&] {
    if (!done) WithdrawQueued(key);
  };
  const MessageKey message = ToMessageKey(key, Phase::kNeighbours);
  // Every neighbour gets its part before an error is returned (SendToEach).
  absl::Status sent;
  for (size_t k = 0; k < neighbours.size(); ++k) {
    sent.Update(transport_->Send(
        neighbours[k], message,
        std::make_shared<const codecs::Bytes>(std::move(parts[k])), deadline));
  }
  GC_RETURN_IF_ERROR(sent);
  GC_ASSIGN_OR_RETURN(
      std::vector<codecs::Bytes> by_rank,
      mailbox_->Collect(message, neighbours, deadline,
                        [this](int r) { return transport_->PeerName(r); }));
  std::vector<codecs::Bytes> got;
  got.reserve(neighbours.size());
  for (int n : neighbours) got.push_back(std::move(by_rank[n]));
  done = true;
  if (metrics_ != nullptr) {
    metrics_->ObserveCollective(Algorithm::kNeighbours, SecondsSince(start));
  }
  return got;
}
// --- end gossip.

void PeerCollective::ForgetJob(const std::string& job) {
  mailbox_->ForgetJob(job);
}

void PeerCollective::Shutdown(const absl::Status& why) { mailbox_->Close(why); }

}  // namespace gradcomp::service
