#include "codecs/cpu/threshold.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "codecs/cpu/kernels.h"
#include "codecs/cpu/parallel.h"
#include "codecs/cpu/sparse_payload.h"
#include "codecs/error_feedback.h"
#include "codecs/wire.h"

namespace gradcomp::codecs {
namespace {

// One part's selection.
struct Selected {
  std::vector<uint32_t> indices;
  std::vector<float> values;
  bool finite = true;
};

void Filter(const float* v, size_t begin, size_t end, float tau,
            Selected* out) {
  bool finite = true;
  for (size_t i = begin; i < end; ++i) {
    const float a = std::fabs(v[i]);
    finite &= a <= std::numeric_limits<float>::max();
    if (a >= tau) {
      out->indices.push_back(static_cast<uint32_t>(i));
      out->values.push_back(v[i]);
    }
  }
  out->finite = finite;
}

float MaxAbs(absl::Span<const float> v) {
  float largest = 0;
  for (float x : v) {
    const float a = std::fabs(x);
    largest = a > largest ? a : largest;
  }
  return largest;
}

}  // namespace

CodecInfo ThresholdInfo() {
  CodecInfo info;
  info.name = "threshold";
  info.id = CodecId::kThreshold;
  info.family = "sparsification";
  info.summable = false;
  info.unbiased = false;
  info.stateful = true;
  info.rounds = 1;
  info.shardable = true;
  info.params = {"tau", "tau_rms"};
  return info;
}

absl::StatusOr<ThresholdOptions> ThresholdSparsifier::ParseOptions(
    const CodecParams& params) {
  ThresholdOptions o;
  GC_ASSIGN_OR_RETURN(const double tau, params.GetDouble("tau", 0));
  GC_ASSIGN_OR_RETURN(const double tau_rms, params.GetDouble("tau_rms", 0));
  GC_RETURN_IF_ERROR(params.CheckAllUsed("threshold"));
  const bool has_tau = params.values().count("tau") > 0;
  const bool has_rms = params.values().count("tau_rms") > 0;
  if (has_tau && has_rms) {
    return absl::InvalidArgumentError(
        "threshold: expected at most one of 'tau' (absolute) and 'tau_rms' "
        "(relative); got both");
  }
  const double value = has_tau ? tau : has_rms ? tau_rms : o.tau_rms;
  if (!(value > 0) || !(value <= std::numeric_limits<float>::max())) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "threshold: parameter '%s' must be a finite value > 0; got %g",
        has_tau ? "tau" : "tau_rms", value));
  }
  o.tau = has_tau ? value : 0;
  o.tau_rms = has_tau ? 0 : value;
  return o;
}

ThresholdSparsifier::ThresholdSparsifier(const ThresholdOptions& options)
    : options_(options), info_(ThresholdInfo()) {
  // Alone it keeps nothing; the accumulation is the decorator's.
  info_.stateful = false;
}

float ThresholdSparsifier::TauFor(absl::Span<const float> v) const {
  // Never below the smallest positive float: zeros are never sent.
  constexpr float kSmallest = std::numeric_limits<float>::denorm_min();
  if (options_.tau > 0) {
    return std::max(static_cast<float>(options_.tau), kSmallest);
  }
  if (v.empty()) return kSmallest;
  const double rms = std::sqrt(SumOfSquares(v) / static_cast<double>(v.size()));
  const float tau = static_cast<float>(options_.tau_rms * rms);
  return std::max(std::min(tau, MaxAbs(v)), kSmallest);
}

absl::Status ThresholdSparsifier::Encode(const TensorView& grad,
                                         TensorState& /*state*/,
                                         const StepContext& /*ctx*/,
                                         Bytes* payload) const {
  const size_t n = grad.numel();
  if (n > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "threshold: tensor has %d elements; uint32 indices allow at most %d", n,
        std::numeric_limits<uint32_t>::max()));
  }
  const float tau = TauFor(grad.values);
  const ParallelOptions options{/*min_per_part=*/size_t{1} << 20,
                                /*align=*/1};
  std::vector<Selected> parts(ParallelParts(n, options));
  ParallelFor(n, options, [&](size_t begin, size_t end, int part) {
    Filter(grad.values.data(), begin, end, tau, &parts[part]);
  });
  for (const Selected& part : parts) {
    if (!part.finite) {
      return absl::InvalidArgumentError(
          "threshold: the accumulated gradient holds NaN or Inf; expected "
          "finite values");
    }
  }
  // Parts are in index order: concatenating keeps the indices ascending.
  Selected& all = parts[0];
  for (size_t p = 1; p < parts.size(); ++p) {
    all.indices.insert(all.indices.end(), parts[p].indices.begin(),
                       parts[p].indices.end());
    all.values.insert(all.values.end(), parts[p].values.begin(),
                      parts[p].values.end());
  }
  WriteSparsePayload(CodecId::kThreshold, n, all.indices, all.values, payload);
  return absl::OkStatus();
}

absl::Status ThresholdSparsifier::DecodeAdd(absl::string_view payload,
                                            float alpha,
                                            absl::Span<float> acc) const {
  return AddSparsePayload(payload, CodecId::kThreshold, "threshold", alpha,
                          acc);
}

absl::Status RegisterThreshold(CodecRegistry& registry) {
  return registry.Register(
      ThresholdInfo(),
      [](const CodecParams& params) -> absl::StatusOr<std::unique_ptr<Codec>> {
        GC_ASSIGN_OR_RETURN(const ThresholdOptions options,
                            ThresholdSparsifier::ParseOptions(params));
        return std::unique_ptr<Codec>(std::make_unique<ErrorFeedback>(
            std::make_unique<ThresholdSparsifier>(options)));
      });
}

}  // namespace gradcomp::codecs
