// The codec interface: a codec turns one worker's gradient into payloads,
// round by round, and turns everybody's payloads back into the average.
//
//   GC_ASSIGN_OR_RETURN(auto session, codec.Start(grad, state, ctx));
//   while (true) {
//     GC_ASSIGN_OR_RETURN(std::optional<Round> round, session->NextRound());
//     if (!round) break;
//     GC_ASSIGN_OR_RETURN(RoundResult r, collective.Run(*round));
//     GC_RETURN_IF_ERROR(session->Absorb(std::move(r)));
//   }
//   GC_RETURN_IF_ERROR(session->Finish(out));
//
// Most codecs have one round and derive from SingleRoundCodec, which writes
// the session once for all of them.
#ifndef GRADCOMP_CODECS_CODEC_H_
#define GRADCOMP_CODECS_CODEC_H_

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "codecs/state.h"
#include "codecs/tensor.h"
#include "codecs/wire.h"

namespace gradcomp::codecs {

// What a round asks of the collective layer.
enum class Collective {
  // Payloads carry a dense body (wire.h: kFlagDenseBody) that can be added
  // element-wise in fp32 as it is; any allreduce works.
  kSum,
  // Payloads must be decoded one by one; the collective hands back all of them.
  kGather,
};

absl::string_view CollectiveName(Collective c);

struct Round {
  Collective collective = Collective::kGather;
  Bytes payload;  // wire format, wire.h
  // kSum, set by the caller or left empty: where the collective may write
  // the sum instead of RoundResult::sum when it has the summed body's
  // length (the caller's output, which the codec then finishes in place:
  // SingleRoundCodec::FinishSumInPlace). Must stay valid during the run.
  absl::Span<float> sum_into;
};

struct RoundResult {
  int world_size = 1;
  // kSum: the fp32 element-wise sum over all workers of the payloads' dense
  // bodies (wire::AddDenseBody of each).
  std::vector<float> sum;
  // kSum: the round's `sum_into` when the collective wrote the sum there
  // (then `sum` is empty); empty otherwise.
  absl::Span<float> summed_into;
  // kGather: every worker's payload, in rank order.
  std::vector<Bytes> payloads;
};

// Identifies one tensor of one step on every rank, for reproducible
// randomness, and says what the caller will ask of the session.
struct StepContext {
  uint64_t seed = 0;       // job seed, the same on every rank
  uint64_t tensor_id = 0;  // TensorId(name), random.h
  int64_t step = 0;
  // Steps of dense warm-up the daemon's policy ran before this codec took
  // the tensor: a codec's own warm-up schedule (DGC's density stages)
  // starts after them, at step - warmup_offset, not at step 0.
  int64_t warmup_offset = 0;
  int rank = 0;
  int world_size = 1;
  // Whether the caller may call DecodeOwn. When false, a single-round
  // session of a stateless codec hands its payload to the round instead of
  // a copy (for a dense tensor, one tensor-sized copy less per step), and
  // DecodeOwn is a FailedPrecondition error.
  bool keep_own = true;
};

struct CodecInfo {
  std::string name;  // registry name, e.g. "topk"
  CodecId id = CodecId::kNone;
  std::string family;     // "dense", "sparsification", "quantization", ...
  bool summable = false;  // its rounds are kSum
  bool unbiased = false;  // E[decode(encode(g))] = g
  bool stateful = false;  // keeps per-tensor state between steps
  int rounds = 1;
  std::vector<std::string> params;  // parameter names it accepts
  // The average is a per-element majority vote on the workers' signs
  // (signSGD), not the mean of their decodes.
  bool majority_vote = false;
  // Encoding a contiguous slice of the flattened tensor on its own is
  // meaningful (element-wise or bucketed codecs), and re-encoding an average
  // with the codec's own state adds no step of the algorithm twice, so a
  // GATHER round may be aggregated sharded (service/collective/
  // sharded_reduce.h). False for codecs that see the tensor as a matrix.
  bool shardable = false;
};

// The owner a codec's tensor state is acquired under (StateStore::Acquire):
// a compressing codec's name, so that a change of codec (SetPolicy, a
// request's codec) starts from empty state; none for a dense codec, which
// keeps none, so that dense steps (a warm-up, a step retried as "none"
// after NaN) leave the compressing codec's state as it was. The same for a
// tensor's own state and its sharded slices'.
absl::string_view StateOwnerOf(const CodecInfo& info);

// The collective a codec's rounds run: kSum for a summable codec, kGather
// otherwise.
Collective RoundCollective(const CodecInfo& info);

// One tensor, one step, on one worker. A session that ends before its step
// completed (the caller met an error and destroyed it) leaves the tensor's
// state as it was before the step, to within rounding: the caller may run
// the step again.
class CodecSession {
 public:
  virtual ~CodecSession() = default;

  // The next round's payload and collective, or nullopt when every round ran.
  virtual absl::StatusOr<std::optional<Round>> NextRound() = 0;

  // Takes the collective's result for the round NextRound() returned last.
  virtual absl::Status Absorb(RoundResult result) = 0;

  // Writes the decoded average over all workers. `out` has numel elements.
  virtual absl::Status Finish(absl::Span<float> out) = 0;

  // Writes this worker's own gradient as it survived compression,
  // D(C(g)) (before averaging); used for error metrics. Valid once
  // NextRound() has returned nullopt.
  virtual absl::Status DecodeOwn(absl::Span<float> out) = 0;
};

// A compression algorithm with fixed parameters. Thread-safe: one instance
// serves many tensors at once; per-tensor state lives in TensorState.
class Codec {
 public:
  virtual ~Codec() = default;

  virtual const CodecInfo& info() const = 0;

  // Starts the session of one tensor and step. `grad` and `state` must
  // outlive the session; the caller holds the state's lock throughout.
  virtual absl::StatusOr<std::unique_ptr<CodecSession>> Start(
      const TensorView& grad, TensorState& state,
      const StepContext& ctx) const = 0;
};

// Base of every codec with exactly one round. Subclasses write Encode and
// DecodeAdd (and FinishSum when the summed body is not the tensor itself).
// x if it is finite, else 0: a state entry that cannot be had back (a
// Revert's inverse that overflowed) restarts from zero.
inline float FiniteOrZero(float x) {
  return std::fabs(x) <= std::numeric_limits<float>::max() ? x : 0.0f;
}

class SingleRoundCodec : public Codec {
 public:
  // Encodes `grad` into `payload` (wire format). May read and update `state`.
  virtual absl::Status Encode(const TensorView& grad, TensorState& state,
                              const StepContext& ctx, Bytes* payload) const = 0;

  // Undoes what a successful Encode of `grad` into `payload` did to
  // `state`, for a step that failed afterwards (in its collective, or on a
  // peer's payload), so that the step can run again with nothing lost or
  // counted twice. To within rounding, and finite: an entry that cannot be
  // had back restarts from zero. SingleRoundCodec's session calls it when it
  // ends unfinished. The default, for codecs without state, does nothing.
  virtual void Revert(const TensorView& grad, TensorState& state,
                      const StepContext& ctx, absl::string_view payload) const;

  // Validates `payload` completely (header, every length, index and count)
  // and adds alpha * decode(payload) to `acc`. A bad payload is an
  // InvalidArgument error and leaves `acc` untouched.
  virtual absl::Status DecodeAdd(absl::string_view payload, float alpha,
                                 absl::Span<float> acc) const = 0;

  // For summable codecs: turns the sum of W dense bodies into the average.
  // The default treats the body as the tensor itself: out = sum / W.
  virtual absl::Status FinishSum(absl::Span<const float> sum, int world_size,
                                 const StepContext& ctx,
                                 absl::Span<float> out) const;

  // Whether FinishSum works with `sum` and `out` the same memory, so that a
  // caller may have the collective sum straight into the output
  // (Round::sum_into). The default FinishSum does; an override that does
  // says so itself.
  virtual bool FinishSumInPlace() const { return false; }

  // For gathered codecs: turns every worker's payload (rank order) into the
  // average. The default is the mean of the decodes. A bad payload is an
  // error naming its rank and leaves `out` untouched.
  virtual absl::Status FinishGather(absl::Span<const Bytes> payloads,
                                    const StepContext& ctx,
                                    absl::Span<float> out) const;

  absl::StatusOr<std::unique_ptr<CodecSession>> Start(
      const TensorView& grad, TensorState& state,
      const StepContext& ctx) const final;

 protected:
  // The body of a FinishGather override that parses every payload before it
  // writes, so that it needs no scratch and a bad payload still leaves `out`
  // untouched with the default's error: `parse(payload, out.size())` gives
  // an absl::StatusOr of a parsed view of the payload, and `combine(parsed,
  // weight, out)` writes into `out` weight times the sum of the decodes of
  // the span `parsed` (rank order).
  template <typename Parse, typename Combine>
  absl::Status ParseAllThenCombine(absl::Span<const Bytes> payloads,
                                   absl::Span<float> out, Parse parse,
                                   Combine combine) const {
    using Parsed = typename std::invoke_result_t<Parse, absl::string_view,
                                                 size_t>::value_type;
    if (payloads.empty()) return NoPayloadsError();
    std::vector<Parsed> parsed;
    parsed.reserve(payloads.size());
    for (size_t r = 0; r < payloads.size(); ++r) {
      absl::StatusOr<Parsed> one = parse(payloads[r], out.size());
      if (!one.ok()) return GatherPayloadError(r, one.status());
      parsed.push_back(*std::move(one));
    }
    const float weight = 1.0f / static_cast<float>(payloads.size());
    combine(absl::Span<const Parsed>(parsed), weight, out);
    return absl::OkStatus();
  }

  // ParseAllThenCombine where `add(parsed, weight, out)` adds weight times
  // one decode to `out`: out is zeroed, then each is added in rank order.
  template <typename Parse, typename Add>
  absl::Status ParseAllThenAverage(absl::Span<const Bytes> payloads,
                                   absl::Span<float> out, Parse parse,
                                   Add add) const {
    return ParseAllThenCombine(
        payloads, out, parse,
        [&](auto parsed, float weight, absl::Span<float> sum) {
          std::fill(sum.begin(), sum.end(), 0.0f);
          for (const auto& one : parsed) add(one, weight, sum);
        });
  }

 private:
  // FinishGather's errors: no payloads at all, and a bad payload of rank
  // `rank`.
  absl::Status NoPayloadsError() const;
  absl::Status GatherPayloadError(size_t rank, const absl::Status& s) const;
};

}  // namespace gradcomp::codecs

#endif  // GRADCOMP_CODECS_CODEC_H_
