#include "service/collective/sharded_reduce.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "base/seconds_since.h"
#include "base/status_macros.h"
#include "codecs/random.h"
#include "service/collective/slice.h"

namespace gradcomp::service {
namespace {

using Clock = std::chrono::steady_clock;

// Every slice has its own Philox streams, so that the W slices of a
// stochastic codec are not rounded with the same numbers.
codecs::StepContext SliceContext(const codecs::StepContext& ctx,
                                 const RoundKey& key, absl::string_view what,
                                 int slice) {
  codecs::StepContext c = ctx;
  c.tensor_id = codecs::TensorId(absl::StrCat(key.tensor, what, slice));
  return c;
}

std::string Where(const RoundKey& key, int slice) {
  return absl::StrCat("sharded '", key.tensor, "' step ", key.step, " slice ",
                      slice);
}

// Asks `keep` (if any) for room for `bytes` of payload copies; its error
// names `where` and `what`.
absl::Status KeepCopy(const KeepCopies& keep, uint64_t bytes,
                      absl::string_view where, absl::string_view what) {
  if (keep == nullptr) return absl::OkStatus();
  absl::Status kept = keep(bytes);
  if (kept.ok()) return kept;
  return absl::Status(kept.code(),
                      absl::StrCat(where, what, ": ", kept.message()));
}

}  // namespace

std::string SliceStateName(absl::string_view tensor, int slice) {
  return absl::StrCat(tensor, "#slice", slice);
}

std::string OwnerStateName(absl::string_view tensor) {
  return absl::StrCat(tensor, "#shard");
}

std::vector<std::string> ShardedStateNames(absl::string_view tensor,
                                           int world_size) {
  std::vector<std::string> names;
  names.reserve(world_size + 1);
  for (int j = 0; j < world_size; ++j) {
    names.push_back(SliceStateName(tensor, j));
  }
  names.push_back(OwnerStateName(tensor));
  return names;
}

absl::string_view StateOwner(absl::string_view name) {
  if (absl::ConsumeSuffix(&name, "#shard")) return name;
  const size_t slice = name.rfind("#slice");
  if (slice == absl::string_view::npos) return name;
  const absl::string_view digits = name.substr(slice + 6);
  if (digits.empty() || !std::all_of(digits.begin(), digits.end(), [](char c) {
        return c >= '0' && c <= '9';
      })) {
    return name;
  }
  return name.substr(0, slice);
}

bool UsedAtWorldSize(absl::string_view name, int world_size) {
  const absl::string_view owner = StateOwner(name);
  if (owner.size() == name.size()) return true;
  if (world_size <= 1) return false;
  absl::string_view rest = name.substr(owner.size());
  if (!absl::ConsumePrefix(&rest, "#slice")) return true;  // "#shard"
  int slice = 0;
  return absl::SimpleAtoi(rest, &slice) && slice < world_size;
}

const codecs::SingleRoundCodec* ShardableCodec(Aggregation mode,
                                               const codecs::Codec& codec,
                                               int world_size, uint64_t numel) {
  const codecs::CodecInfo& info = codec.info();
  if (mode == Aggregation::kAllgather || !info.shardable || info.summable ||
      info.rounds != 1 || world_size < 2 ||
      numel < static_cast<uint64_t>(world_size)) {
    return nullptr;
  }
  if (mode == Aggregation::kAuto &&
      (world_size < kAutoMinWorldSize || numel < kAutoMinNumel)) {
    return nullptr;
  }
  return dynamic_cast<const codecs::SingleRoundCodec*>(&codec);
}

absl::Status DecodeSlices(const codecs::SingleRoundCodec& codec,
                          absl::Span<const codecs::Bytes> parts,
                          absl::Span<float> out) {
  const int w = static_cast<int>(parts.size());
  std::fill(out.begin(), out.end(), 0.0f);
  for (int j = 0; j < w; ++j) {
    const Slice r = SliceOf(out.size(), w, j);
    absl::Status decoded =
        codec.DecodeAdd(parts[j], 1.0f, out.subspan(r.begin, r.size));
    if (!decoded.ok()) {
      return absl::Status(decoded.code(),
                          absl::StrCat("slice ", j, ": ", decoded.message()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ShardedStats> ShardedReduce(
    Collective& collective, codecs::StateStore& store,
    const codecs::SingleRoundCodec& codec, const RoundKey& key,
    absl::Span<const float> grad, const codecs::StepContext& ctx,
    absl::Span<float> out, std::vector<codecs::Bytes>* own_parts,
    const KeepCopies& keep) {
  const int w = collective.world_size();
  const int me = collective.rank();
  const size_t n = grad.size();
  if (out.size() != n || n < static_cast<size_t>(w)) {
    return absl::InternalError(absl::StrCat(
        "sharded '", key.tensor, "': ", n, " elements and an output of ",
        out.size(), "; expected equal sizes and at least ", w,
        " elements (one per rank)"));
  }
  ShardedStats stats;

  // Each slice encoded on its own, with this worker's state of the slice
  // (an entry of its own: no copies of whole-tensor buffers).
  Clock::time_point t = Clock::now();
  std::vector<codecs::Bytes> parts(w);
  // A step that fails once a slice is encoded gives that slice's state back,
  // as a codec session does (SingleRoundCodec::Revert): the stateful
  // codecs' payloads, kept for it, are compressed ones.
  const bool stateful = codec.info().stateful;
  // As the tensor's own state: another codec's slices start empty.
  const absl::string_view owner = codecs::StateOwnerOf(codec.info());
  std::vector<codecs::Bytes> encoded_parts;
  absl::Cleanup revert_slices = [&] {
    for (int j = 0; j < static_cast<int>(encoded_parts.size()); ++j) {
      const Slice r = SliceOf(n, w, j);
      const int64_t shape[] = {static_cast<int64_t>(r.size)};
      codecs::StateStore::Locked slice_state = store.Acquire(
          key.job, SliceStateName(key.tensor, j), shape, 0, owner);
      codec.Revert(codecs::TensorView{grad.subspan(r.begin, r.size), shape},
                   *slice_state, SliceContext(ctx, key, "#slice", j),
                   encoded_parts[j]);
    }
  };
  for (int j = 0; j < w; ++j) {
    const Slice r = SliceOf(n, w, j);
    const int64_t shape[] = {static_cast<int64_t>(r.size)};
    codecs::StateStore::Locked slice_state =
        store.Acquire(key.job, SliceStateName(key.tensor, j), shape, 0, owner);
    absl::Status encoded = codec.Encode(
        codecs::TensorView{grad.subspan(r.begin, r.size), shape}, *slice_state,
        SliceContext(ctx, key, "#slice", j), &parts[j]);
    if (!encoded.ok()) {
      return absl::Status(encoded.code(),
                          absl::StrCat(Where(key, j), ": ", encoded.message()));
    }
    if (stateful) encoded_parts.push_back(parts[j]);
    stats.wire_bytes += parts[j].size();
  }
  if (stateful) {
    GC_RETURN_IF_ERROR(KeepCopy(keep, stats.wire_bytes, Where(key, me), ""));
  }
  if (own_parts != nullptr && !stateful) *own_parts = parts;
  stats.encode_seconds += SecondsSince(t);

  t = Clock::now();
  GC_ASSIGN_OR_RETURN(std::vector<codecs::Bytes> got,
                      collective.AllToAll(key, std::move(parts)));
  stats.collective_seconds += SecondsSince(t);

  // The owner: the W payloads of its slice, averaged (FinishGather checks
  // each and names its rank), re-encoded with the owner's own state.
  t = Clock::now();
  const Slice mine = SliceOf(n, w, me);
  const codecs::StepContext owner_ctx = SliceContext(ctx, key, "#shard", me);
  std::vector<float> average(mine.size);
  absl::Status averaged =
      codec.FinishGather(got, owner_ctx, absl::MakeSpan(average));
  if (!averaged.ok()) {
    return absl::Status(averaged.code(),
                        absl::StrCat(Where(key, me), ": ", averaged.message()));
  }
  stats.decode_seconds += SecondsSince(t);
  t = Clock::now();
  const int64_t owner_shape[] = {static_cast<int64_t>(mine.size)};
  // A stateful codec's re-encode, set once the owner's state has taken its
  // step: what gives that state back if anything after fails.
  std::optional<codecs::Bytes> owner_sent;
  absl::Cleanup revert_owner = [&] {
    if (!owner_sent.has_value()) return;
    codecs::StateStore::Locked owner_state = store.Acquire(
        key.job, OwnerStateName(key.tensor), owner_shape, 0, owner);
    codec.Revert(codecs::TensorView{average, owner_shape}, *owner_state,
                 owner_ctx, *owner_sent);
  };
  codecs::Bytes reencoded;
  {
    codecs::StateStore::Locked owner_state = store.Acquire(
        key.job, OwnerStateName(key.tensor), owner_shape, 0, owner);
    absl::Status encoded =
        codec.Encode(codecs::TensorView{average, owner_shape}, *owner_state,
                     owner_ctx, &reencoded);
    if (!encoded.ok()) {
      return absl::Status(encoded.code(),
                          absl::StrCat(Where(key, me), " (owner re-encode): ",
                                       encoded.message()));
    }
  }
  if (stateful) {
    owner_sent = reencoded;
    GC_RETURN_IF_ERROR(
        KeepCopy(keep, reencoded.size(), Where(key, me), " (owner re-encode)"));
  }
  stats.wire_bytes += reencoded.size();
  stats.encode_seconds += SecondsSince(t);

  t = Clock::now();
  GC_ASSIGN_OR_RETURN(got, collective.Allgather(key, std::move(reencoded)));
  stats.collective_seconds += SecondsSince(t);

  // Every rank decodes the same W re-encoded slices, in rank order.
  t = Clock::now();
  absl::Status decoded = DecodeSlices(codec, got, out);
  if (!decoded.ok()) {
    return absl::Status(
        decoded.code(),
        absl::StrCat("sharded '", key.tensor, "' step ", key.step,
                     ", re-encoded by its owner: ", decoded.message()));
  }
  stats.decode_seconds += SecondsSince(t);
  std::move(revert_slices).Cancel();
  std::move(revert_owner).Cancel();
  if (own_parts != nullptr && stateful) *own_parts = std::move(encoded_parts);
  return stats;
}

ShardedSession::ShardedSession(Collective& collective,
                               codecs::StateStore& store,
                               const codecs::SingleRoundCodec& codec,
                               RoundKey key, absl::Span<const float> grad,
                               const codecs::StepContext& ctx, KeepCopies keep)
    : collective_(collective),
      store_(store),
      codec_(codec),
      key_(std::move(key)),
      grad_(grad),
      ctx_(ctx),
      keep_(std::move(keep)) {}

absl::StatusOr<std::optional<codecs::Round>> ShardedSession::NextRound() {
  if (!done_) {
    average_.resize(grad_.size());
    GC_ASSIGN_OR_RETURN(
        stats_, ShardedReduce(collective_, store_, codec_, key_, grad_, ctx_,
                              absl::MakeSpan(average_),
                              ctx_.keep_own ? &own_parts_ : nullptr, keep_));
    done_ = true;
  }
  return std::nullopt;
}

absl::Status ShardedSession::Absorb(codecs::RoundResult /*result*/) {
  return absl::FailedPreconditionError(
      "a sharded session runs its exchanges itself; expected no round "
      "result to absorb");
}

absl::Status ShardedSession::Finish(absl::Span<float> out) {
  if (!done_ || out.size() != average_.size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "sharded '", key_.tensor, "': Finish with ", out.size(),
        " values before or without a completed reduce of ", grad_.size()));
  }
  std::copy(average_.begin(), average_.end(), out.begin());
  return absl::OkStatus();
}

absl::Status ShardedSession::DecodeOwn(absl::Span<float> out) {
  if (!done_ || out.size() != grad_.size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "sharded '", key_.tensor, "': DecodeOwn with ", out.size(),
        " values before or without a completed reduce of ", grad_.size()));
  }
  return DecodeSlices(codec_, own_parts_, out);
}

}  // namespace gradcomp::service
