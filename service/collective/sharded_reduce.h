// Sharded aggregation of a GATHER codec: rank j owns slice j of the
// flattened tensor. Every rank encodes each slice on its own and sends slice
// j's payload to rank j (AllToAll); the owner decodes the W payloads of its
// slice, averages them (or takes the majority vote of sign codecs),
// re-encodes the average with its own error-feedback state and sends that
// to everyone (Allgather); every rank decodes the W re-encoded slices. A
// worker sends about 2P bytes whatever W, against (W-1)P for allgather.
// Results are bit-identical on every rank: all decode the same bytes.
//
//   const codecs::SingleRoundCodec* codec =
//       ShardableCodec(Aggregation::kAuto, *any_codec, world_size, numel);
//   if (codec != nullptr) {
//     GC_ASSIGN_OR_RETURN(ShardedStats stats,
//                         ShardedReduce(collective, store, *codec, key, grad,
//                                       ctx, out, nullptr));
//   }
#ifndef GRADCOMP_SERVICE_COLLECTIVE_SHARDED_REDUCE_H_
#define GRADCOMP_SERVICE_COLLECTIVE_SHARDED_REDUCE_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "codecs/codec.h"
#include "codecs/state.h"
#include "service/collective/collective.h"

namespace gradcomp::service {

// How a GATHER round is aggregated (a policy setting).
enum class Aggregation {
  kAllgather,  // every rank sends its payload to every other
  kSharded,    // this file, when the codec allows it; else allgather
  kAuto,       // sharded where the cost model says it pays (below)
};

// `auto`'s thresholds (docs/peers.md, "Sharded or allgather"): sharded
// sends 2/W of allgather's bytes and decodes ~2 payloads' worth instead of
// W, but pays a second encode of 1/W of the tensor, a second message
// latency and a second compression error. Measured (bench/sharded_bench.cc)
// and modelled at 1 Gbit/s, it wins for QSGD 4-bit from W = 3 and breaks
// even for top-k 1 % at W = 4, winning more as W grows; below 1M values
// the message latency dominates. `auto` decides from W, the element count
// and the codec only (the same on every rank), never a rank's payload size.
inline constexpr int kAutoMinWorldSize = 4;
inline constexpr uint64_t kAutoMinNumel = uint64_t{1} << 20;

// The codec as a SingleRoundCodec when its GATHER round is to be sharded
// under `mode` for a tensor of `numel` elements on `world_size` ranks;
// nullptr when the round goes by allgather (or is a SUM round): the codec
// is summable, multi-round or not shardable (CodecInfo::shardable), the
// world has one rank, a slice would be empty, or `auto` says allgather.
const codecs::SingleRoundCodec* ShardableCodec(Aggregation mode,
                                               const codecs::Codec& codec,
                                               int world_size, uint64_t numel);

// Where sharded aggregation keeps its codec state, in the StateStore under
// the tensor's job (so it is exported and imported with the job's other
// state): this worker's state for slice j under SliceStateName(tensor, j),
// the owner's state of its slice under OwnerStateName(tensor). Each resets
// when its slice's size changes (another world size). They are not the
// tensor's own state: a tensor whose policy switches between allgather and
// sharded starts the other mode's residuals from zero.
std::string SliceStateName(absl::string_view tensor, int slice);
std::string OwnerStateName(absl::string_view tensor);
// Every entry name sharded aggregation may keep for `tensor` in a world of
// `world_size` ranks: the slices' and the owner's.
std::vector<std::string> ShardedStateNames(absl::string_view tensor,
                                           int world_size);
// The tensor whose state the store entry `name` holds: the tensor of a
// SliceStateName or OwnerStateName, else `name` itself.
absl::string_view StateOwner(absl::string_view name);
// Whether a daemon of `world_size` ranks uses (and counts) the store entry
// `name`: a tensor's own, or one of ShardedStateNames(its owner,
// world_size). Not the slices of a larger world (state exported by one),
// nor any sharded entry with one rank.
bool UsedAtWorldSize(absl::string_view name, int world_size);

struct ShardedStats {
  // Payload bytes this rank encoded: its W slice payloads and its owned
  // slice's re-encode.
  uint64_t wire_bytes = 0;
  double encode_seconds = 0;
  double collective_seconds = 0;
  double decode_seconds = 0;
};

// Told the bytes of the payload copies a sharded reduce keeps to give a
// stateful codec's state back should the step fail, before it sends them;
// an error fails the step (a memory budget that cannot hold them).
using KeepCopies = std::function<absl::Status(uint64_t bytes)>;

// Runs one sharded reduce of `grad` (the tensor's values, flattened; the
// caller serialises calls for the same tensor). `out` receives the average
// (grad.size() values); `own_parts`, when not null, this worker's W slice
// payloads (for DecodeSlices, error metrics; a stateful codec's undo copies
// become them, so they are kept once). `keep`, when set, is told of the
// undo copies. Errors name the rank and slice.
absl::StatusOr<ShardedStats> ShardedReduce(
    Collective& collective, codecs::StateStore& store,
    const codecs::SingleRoundCodec& codec, const RoundKey& key,
    absl::Span<const float> grad, const codecs::StepContext& ctx,
    absl::Span<float> out, std::vector<codecs::Bytes>* own_parts,
    const KeepCopies& keep = nullptr);

// Decodes slice payloads (parts[j] holds slice j of W = parts.size()) into
// `out`, the whole tensor.
absl::Status DecodeSlices(const codecs::SingleRoundCodec& codec,
                          absl::Span<const codecs::Bytes> parts,
                          absl::Span<float> out);

// ShardedReduce as a CodecSession, so that the engine runs it through its
// usual pipeline: the first NextRound() runs the whole reduce (both
// exchanges) and reports no round to run; Finish writes the average;
// DecodeOwn decodes this worker's slice payloads, which it keeps only when
// ctx.keep_own. Arguments as for ShardedReduce; they must outlive the
// session.
class ShardedSession : public codecs::CodecSession {
 public:
  ShardedSession(Collective& collective, codecs::StateStore& store,
                 const codecs::SingleRoundCodec& codec, RoundKey key,
                 absl::Span<const float> grad, const codecs::StepContext& ctx,
                 KeepCopies keep = nullptr);

  absl::StatusOr<std::optional<codecs::Round>> NextRound() override;
  absl::Status Absorb(codecs::RoundResult result) override;
  absl::Status Finish(absl::Span<float> out) override;
  absl::Status DecodeOwn(absl::Span<float> out) override;

  // Valid once NextRound() returned.
  const ShardedStats& stats() const { return stats_; }

 private:
  Collective& collective_;
  codecs::StateStore& store_;
  const codecs::SingleRoundCodec& codec_;
  const RoundKey key_;
  const absl::Span<const float> grad_;
  const codecs::StepContext ctx_;
  const KeepCopies keep_;
  bool done_ = false;
  std::vector<float> average_;
  std::vector<codecs::Bytes> own_parts_;
  ShardedStats stats_;
};

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_COLLECTIVE_SHARDED_REDUCE_H_
