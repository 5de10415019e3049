#include "codecs/codec.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "codecs/wire.h"

namespace gradcomp::codecs {

absl::string_view StateOwnerOf(const CodecInfo& info) {
  return info.family == "dense" ? absl::string_view() : info.name;
}

Collective RoundCollective(const CodecInfo& info) {
  return info.summable ? Collective::kSum : Collective::kGather;
}

absl::string_view CollectiveName(Collective c) {
  switch (c) {
    case Collective::kSum:
      return "sum";
    case Collective::kGather:
      return "gather";
  }
  return "unknown";
}

absl::Status SingleRoundCodec::FinishSum(absl::Span<const float> sum,
                                         int world_size,
                                         const StepContext& /*ctx*/,
                                         absl::Span<float> out) const {
  if (world_size < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: expected a world size >= 1, got %d", info().name, world_size));
  }
  if (sum.size() != out.size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: expected a sum of %d elements, got %d",
                        info().name, out.size(), sum.size()));
  }
  // Four lanes at a time with GCC's vector extension (SSE2, every x86-64):
  // the plain loop compiled to one scalar division per element. Still a
  // division, so the result is bit-for-bit sum / W.
  using Float4 = float __attribute__((vector_size(16)));
  const float w = static_cast<float>(world_size);
  const size_t n = out.size();
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    Float4 v;
    std::memcpy(&v, sum.data() + i, sizeof(v));
    v = v / w;
    std::memcpy(out.data() + i, &v, sizeof(v));
  }
  for (; i < n; ++i) out[i] = sum[i] / w;
  return absl::OkStatus();
}

void SingleRoundCodec::Revert(const TensorView& /*grad*/,
                              TensorState& /*state*/,
                              const StepContext& /*ctx*/,
                              absl::string_view /*payload*/) const {}

absl::Status SingleRoundCodec::NoPayloadsError() const {
  return absl::InvalidArgumentError(absl::StrFormat(
      "%s: expected at least one gathered payload, got none", info().name));
}

absl::Status SingleRoundCodec::GatherPayloadError(size_t rank,
                                                  const absl::Status& s) const {
  return absl::Status(
      s.code(), absl::StrFormat("%s: payload of rank %d: %s", info().name, rank,
                                s.message()));
}

absl::Status SingleRoundCodec::FinishGather(absl::Span<const Bytes> payloads,
                                            const StepContext& /*ctx*/,
                                            absl::Span<float> out) const {
  if (payloads.empty()) return NoPayloadsError();
  // Decode into scratch first: a bad payload from any worker must leave
  // `out` as it was.
  std::vector<float> average;
  average.reserve(out.size());
  AdviseHugePages(average.data(), out.size() * sizeof(float));
  average.resize(out.size(), 0.0f);
  const float weight = 1.0f / static_cast<float>(payloads.size());
  for (size_t r = 0; r < payloads.size(); ++r) {
    absl::Status s = DecodeAdd(payloads[r], weight, absl::MakeSpan(average));
    if (!s.ok()) return GatherPayloadError(r, s);
  }
  std::copy(average.begin(), average.end(), out.begin());
  return absl::OkStatus();
}

namespace {

// The session every single-round codec shares: encode once, hand the payload
// to the collective, then decode what came back. Ended unfinished after a
// successful encode, it has the codec revert the state (Revert).
class SingleRoundSession : public CodecSession {
 public:
  SingleRoundSession(const SingleRoundCodec& codec, const TensorView& grad,
                     TensorState& state, const StepContext& ctx)
      : codec_(codec), grad_(grad), state_(state), ctx_(ctx) {}

  ~SingleRoundSession() override {
    if (stage_ != Stage::kStart && !finished_) {
      codec_.Revert(grad_, state_, ctx_, own_);
    }
  }

  absl::StatusOr<std::optional<Round>> NextRound() override {
    if (stage_ == Stage::kStart) {
      GC_RETURN_IF_ERROR(codec_.Encode(grad_, state_, ctx_, &own_));
      stage_ = Stage::kAwaitingResult;
      Round round;
      round.collective = collective();
      // A stateful codec's Revert needs the payload; it is a compressed one
      // (dense codecs keep no state), so the copy is small.
      if (!ctx_.keep_own && !codec_.info().stateful) {
        round.payload = std::move(own_);
        return std::optional<Round>(std::move(round));
      }
      round.payload.reserve(own_.size());
      AdviseHugePages(round.payload.data(), own_.size());
      round.payload.assign(own_);
      return std::optional<Round>(std::move(round));
    }
    if (stage_ == Stage::kAwaitingResult) {
      return Error("NextRound", "Absorb() of round 0 has not run");
    }
    return std::optional<Round>();
  }

  absl::Status Absorb(RoundResult result) override {
    if (stage_ != Stage::kAwaitingResult) {
      return Error("Absorb", stage_ == Stage::kStart
                                 ? "NextRound() has not run"
                                 : "round 0 was already absorbed");
    }
    if (result.world_size < 1) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: expected a world size >= 1, got %d", name(), result.world_size));
    }
    // A summed body's length is the codec's to check (FinishSum): it need
    // not be the tensor's.
    if (collective() == Collective::kGather &&
        result.payloads.size() != static_cast<size_t>(result.world_size)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: expected %d gathered payloads (one per worker), got %d", name(),
          result.world_size, result.payloads.size()));
    }
    result_ = std::move(result);
    stage_ = Stage::kAbsorbed;
    return absl::OkStatus();
  }

  absl::Status Finish(absl::Span<float> out) override {
    if (stage_ != Stage::kAbsorbed) {
      return Error("Finish", "the round's result has not been absorbed");
    }
    GC_RETURN_IF_ERROR(CheckOutSize(out));
    GC_RETURN_IF_ERROR(FinishInto(out));
    finished_ = true;
    return absl::OkStatus();
  }

  absl::Status DecodeOwn(absl::Span<float> out) override {
    if (stage_ == Stage::kStart) {
      return Error("DecodeOwn", "NextRound() has not run");
    }
    if (!ctx_.keep_own) {
      return Error("DecodeOwn",
                   "the session was started with keep_own false, so its "
                   "payload went to the round without a copy");
    }
    GC_RETURN_IF_ERROR(CheckOutSize(out));
    std::fill(out.begin(), out.end(), 0.0f);
    return codec_.DecodeAdd(own_, 1.0f, out);
  }

 private:
  enum class Stage { kStart, kAwaitingResult, kAbsorbed };

  absl::Status FinishInto(absl::Span<float> out) const {
    if (collective() == Collective::kGather) {
      return codec_.FinishGather(result_.payloads, ctx_, out);
    }
    if (result_.summed_into.empty()) {
      return codec_.FinishSum(result_.sum, result_.world_size, ctx_, out);
    }
    if (result_.summed_into.data() != out.data() ||
        result_.summed_into.size() != out.size() ||
        !codec_.FinishSumInPlace()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: the sum was written into a buffer of %d elements that is "
          "not this output; expected the output itself, with a codec that "
          "finishes a sum in place",
          name(), result_.summed_into.size()));
    }
    return codec_.FinishSum(out, result_.world_size, ctx_, out);
  }

  Collective collective() const { return RoundCollective(codec_.info()); }
  const std::string& name() const { return codec_.info().name; }

  absl::Status Error(absl::string_view call, absl::string_view why) const {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s session: %s called out of order: %s", name(), call, why));
  }

  absl::Status CheckOutSize(absl::Span<float> out) const {
    if (out.size() != grad_.numel()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: expected an output of %d elements, got %d",
                          name(), grad_.numel(), out.size()));
    }
    return absl::OkStatus();
  }

  const SingleRoundCodec& codec_;
  const TensorView grad_;
  TensorState& state_;
  const StepContext ctx_;
  Stage stage_ = Stage::kStart;
  bool finished_ = false;  // Finish succeeded: the step's state stands
  Bytes own_;
  RoundResult result_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<CodecSession>> SingleRoundCodec::Start(
    const TensorView& grad, TensorState& state, const StepContext& ctx) const {
  if (ctx.world_size < 1 || ctx.rank < 0 || ctx.rank >= ctx.world_size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: expected 0 <= rank < world_size, got rank %d of %d", info().name,
        ctx.rank, ctx.world_size));
  }
  return std::unique_ptr<CodecSession>(
      std::make_unique<SingleRoundSession>(*this, grad, state, ctx));
}

}  // namespace gradcomp::codecs
