#include "codecs/cpu/topk.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "codecs/cpu/select.h"
#include "codecs/cpu/sparse_payload.h"
#include "codecs/random.h"
#include "codecs/wire.h"

namespace gradcomp::codecs {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the payload's values are written with host-order memcpy");

constexpr double kWarmupDensities[] = {0.25, 0.0625, 0.0156, 0.004};

// out = weight * the sum of every rank's pairs, and 0 where no rank sent a
// value. Bit for bit what zeroing out and then AddSparsePairs rank by rank
// gives: each element gets the same additions in the same order, onto +0. But
// out is written stretch by stretch, each zeroed and then given every rank's
// pairs in it while it is still in cache, instead of zeroed whole and then
// added to at scattered places, each a cache miss on a large tensor.
void AveragePairs(absl::Span<const SparsePairs> ranks, float weight,
                  absl::Span<float> out) {
  constexpr size_t kStretch = 8192;  // 32 KB of out
  std::vector<size_t> next(ranks.size(), 0);
  for (size_t begin = 0; begin < out.size(); begin += kStretch) {
    const size_t end = std::min(out.size(), begin + kStretch);
    std::fill(out.begin() + begin, out.begin() + end, 0.0f);
    for (size_t r = 0; r < ranks.size(); ++r) {
      const std::vector<uint32_t>& indices = ranks[r].indices;
      size_t j = next[r];
      // Indices ascend (index_coding.h), so rank r's pairs in this stretch
      // start where its last stretch stopped.
      for (; j < indices.size() && indices[j] < end; ++j) {
        out[indices[j]] += weight * ranks[r].value(j);
      }
      next[r] = j;
    }
  }
}

absl::Status CheckRange(absl::string_view name, double value, double low,
                        bool low_inclusive, double high, bool high_inclusive) {
  const bool ok = std::isfinite(value) &&
                  (low_inclusive ? value >= low : value > low) &&
                  (high_inclusive ? value <= high : value < high);
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "topk: parameter '%s' must be in %c%g, %g%c; got %g", name,
      low_inclusive ? '[' : '(', low, high, high_inclusive ? ']' : ')', value));
}

}  // namespace

CodecInfo TopKInfo() {
  CodecInfo info;
  info.name = "topk";
  info.id = CodecId::kTopK;
  info.family = "sparsification";
  info.summable = false;
  info.unbiased = false;
  info.stateful = true;
  info.shardable = true;
  info.rounds = 1;
  info.params = {"clip_norm",
                 "masking",
                 "momentum",
                 "nesterov",
                 "ratio",
                 "sample",
                 "warmup_steps_per_stage"};
  return info;
}

absl::StatusOr<std::unique_ptr<TopKCodec>> TopKCodec::Create(
    const CodecParams& params) {
  TopKOptions o;
  GC_ASSIGN_OR_RETURN(o.ratio, params.GetDouble("ratio", o.ratio));
  GC_ASSIGN_OR_RETURN(o.sample, params.GetDouble("sample", o.sample));
  GC_ASSIGN_OR_RETURN(const double momentum,
                      params.GetDouble("momentum", o.momentum));
  GC_ASSIGN_OR_RETURN(o.nesterov, params.GetBool("nesterov", o.nesterov));
  GC_ASSIGN_OR_RETURN(o.masking, params.GetBool("masking", o.masking));
  GC_ASSIGN_OR_RETURN(o.clip_norm, params.GetDouble("clip_norm", o.clip_norm));
  GC_ASSIGN_OR_RETURN(
      o.warmup_steps_per_stage,
      params.GetInt("warmup_steps_per_stage", o.warmup_steps_per_stage));
  GC_RETURN_IF_ERROR(params.CheckAllUsed("topk"));
  GC_RETURN_IF_ERROR(CheckRange("ratio", o.ratio, 0, false, 1, true));
  GC_RETURN_IF_ERROR(CheckRange("sample", o.sample, 0, false, 1, true));
  GC_RETURN_IF_ERROR(CheckRange("momentum", momentum, 0, true, 1, false));
  GC_RETURN_IF_ERROR(CheckRange("clip_norm", o.clip_norm, 0, true,
                                std::numeric_limits<double>::max(), true));
  if (o.warmup_steps_per_stage < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "topk: parameter 'warmup_steps_per_stage' must be >= 0; got %d",
        o.warmup_steps_per_stage));
  }
  o.momentum = static_cast<float>(momentum);
  return std::make_unique<TopKCodec>(o);
}

TopKCodec::TopKCodec(const TopKOptions& options)
    : options_(options),
      momentum_(
          MomentumCorrection::Options{options.momentum, options.nesterov}),
      info_(TopKInfo()) {
  // Momentum correction and norm clipping at a shard owner would apply a
  // second time to the average, and clipping a slice is not clipping the
  // tensor.
  info_.shardable = options.momentum == 0 && options.clip_norm == 0;
}

double TopKCodec::DensityAt(int64_t step) const {
  const int64_t per_stage = options_.warmup_steps_per_stage;
  if (per_stage == 0) return options_.ratio;
  const int64_t stage = std::max<int64_t>(step, 0) / per_stage;
  constexpr int64_t kStages = std::size(kWarmupDensities);
  if (stage >= kStages) return options_.ratio;
  return std::max(options_.ratio, kWarmupDensities[stage]);
}

size_t TopKCodec::KAt(size_t numel, int64_t step) const {
  if (numel == 0) return 0;
  // The 1e-9 absorbs the rounding of density * numel (0.001 * 25e6 is
  // 25000.000000000004 in double), which would otherwise add one.
  const double k =
      std::ceil(DensityAt(step) * static_cast<double>(numel) - 1e-9);
  return static_cast<size_t>(std::clamp(k, 1.0, static_cast<double>(numel)));
}

absl::Status TopKCodec::Encode(const TensorView& grad, TensorState& state,
                               const StepContext& ctx, Bytes* payload) const {
  return EncodeWith(
      grad, state, ctx,
      [](absl::Span<const float> v, size_t k, double sample,
         const PhiloxStream& rng) -> absl::StatusOr<TopKSelection> {
        return SelectTopK(v, k, sample, rng);
      },
      payload);
}

absl::Status TopKCodec::EncodeWith(const TensorView& grad, TensorState& state,
                                   const StepContext& ctx, Selector select,
                                   Bytes* payload) const {
  const size_t n = grad.numel();
  if (n > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "topk: tensor has %d elements; uint32 indices allow at most %d", n,
        std::numeric_limits<uint32_t>::max()));
  }
  const float scale = ClipScale(grad.values, options_.clip_norm);
  absl::Span<float> v = momentum_.Accumulate(grad.values, scale, state);
  const PhiloxStream rng(ctx.seed, ctx.tensor_id, ctx.step, /*round=*/0);
  absl::StatusOr<TopKSelection> selected =
      select(v, KAt(n, ctx.step - ctx.warmup_offset), options_.sample, rng);
  if (!selected.ok()) {
    // The GPU's selection can fail (device memory, a CUDA error): the step
    // then took nothing, and its accumulation is given back.
    momentum_.Revert(grad.values, scale, {}, {}, /*masking=*/false, state);
    return selected.status();
  }
  const TopKSelection selection = *std::move(selected);
  const std::vector<uint32_t>& indices = selection.indices;
  char* values = BeginSparsePayload(CodecId::kTopK, n, indices, payload);
  bool finite = true;
  for (size_t j = 0; j < indices.size(); ++j) {
    const float value = v[indices[j]];
    finite &= std::fabs(value) <= std::numeric_limits<float>::max();
    std::memcpy(values + sizeof(float) * j, &value, sizeof(float));
  }
  // The selection ranks NaN and Inf above every finite value (select.h), so
  // it holds one whenever v does.
  if (!finite) return RefuseNonFinite(grad.values, scale, state);
  momentum_.Sent(indices, options_.masking, state);
  return absl::OkStatus();
}

void TopKCodec::Revert(const TensorView& grad, TensorState& state,
                       const StepContext& /*ctx*/,
                       absl::string_view payload) const {
  // Encode wrote this payload for this tensor, so it parses.
  absl::StatusOr<SparsePairs> sent = ParseTopKPayload(payload, grad.numel());
  if (!sent.ok()) {
    state.Clear();
    return;
  }
  std::vector<float> values(sent->indices.size());
  for (size_t j = 0; j < values.size(); ++j) values[j] = sent->value(j);
  momentum_.Revert(grad.values, ClipScale(grad.values, options_.clip_norm),
                   sent->indices, values, options_.masking, state);
}

absl::Status TopKCodec::RefuseNonFinite(absl::Span<const float> g, float scale,
                                        TensorState& state) const {
  const MomentumCorrection::Reset reset =
      momentum_.RefuseNonFinite(g, scale, state);
  return absl::InvalidArgumentError(absl::StrFormat(
      "topk: the accumulated gradient holds NaN or Inf at %d entries (first "
      "at index %d); expected finite values. Those entries restart from "
      "zero; the others are as before this step",
      reset.count, reset.first));
}

absl::StatusOr<SparsePairs> ParseTopKPayload(absl::string_view payload,
                                             size_t n) {
  return ParseSparsePayload(payload, CodecId::kTopK, "topk", n);
}

absl::Status TopKCodec::DecodeAdd(absl::string_view payload, float alpha,
                                  absl::Span<float> acc) const {
  return AddSparsePayload(payload, CodecId::kTopK, "topk", alpha, acc);
}

absl::Status TopKCodec::FinishGather(absl::Span<const Bytes> payloads,
                                     const StepContext& /*ctx*/,
                                     absl::Span<float> out) const {
  return ParseAllThenCombine(payloads, out, ParseTopKPayload, AveragePairs);
}

absl::Status RegisterTopK(CodecRegistry& registry) {
  return registry.Register(
      TopKInfo(),
      [](const CodecParams& params) -> absl::StatusOr<std::unique_ptr<Codec>> {
        GC_ASSIGN_OR_RETURN(std::unique_ptr<TopKCodec> codec,
                            TopKCodec::Create(params));
        return std::unique_ptr<Codec>(std::move(codec));
      });
}

}  // namespace gradcomp::codecs
