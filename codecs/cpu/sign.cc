#include "codecs/cpu/sign.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "codecs/cpu/bitpack.h"
#include "codecs/cpu/parallel.h"
#include "codecs/error_feedback.h"
#include "codecs/wire.h"

namespace gradcomp::codecs {
namespace {

constexpr size_t kScaleBytes = 4;
constexpr ParallelOptions kParts{/*min_per_part=*/size_t{1} << 20,
                                 /*align=*/64};

size_t BodyBytes(size_t n) { return kScaleBytes + SignBytes(n); }

struct SignPayload {
  float scale = 0;
  const char* signs = nullptr;
};

// Validates a sign payload of codec `info` for n elements completely.
absl::StatusOr<SignPayload> ParseSign(const CodecInfo& info,
                                      absl::string_view payload, size_t n) {
  GC_ASSIGN_OR_RETURN(const ParsedPayload parsed,
                      ParsePayload(payload, info.id, /*round=*/0, n));
  if (parsed.header.flags != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: expected header flags 0 (not a dense body), got 0x%02x", info.name,
        parsed.header.flags));
  }
  if (!parsed.params.empty()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: expected no parameter bytes, got %d", info.name,
                        parsed.params.size()));
  }
  if (parsed.body.size() != BodyBytes(n)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: %d elements need a body of %d bytes (scale + signs), got %d",
        info.name, n, BodyBytes(n), parsed.body.size()));
  }
  SignPayload out;
  std::memcpy(&out.scale, parsed.body.data(), kScaleBytes);
  if (!(out.scale >= 0) || !std::isfinite(out.scale)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: expected a finite scale >= 0, got %g", info.name, out.scale));
  }
  out.signs = parsed.body.data() + kScaleBytes;
  if (!SignPaddingIsZero(out.signs, n)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: expected the padding bits after %d signs to be zero", info.name,
        n));
  }
  return out;
}

// m <- beta*m + (1 - beta)*g, the exponential average of Signum.
void UpdateMomentum(absl::Span<const float> g, float beta,
                    absl::Span<float> m) {
  const float rest = 1.0f - beta;
  ParallelFor(g.size(), kParts, [&](size_t begin, size_t end, int) {
    for (size_t i = begin; i < end; ++i) m[i] = beta * m[i] + rest * g[i];
  });
}

}  // namespace

CodecInfo SignInfo(SignCodec::Variant variant) {
  CodecInfo info;
  info.family = "quantization";
  info.summable = false;
  info.unbiased = false;
  info.rounds = 1;
  switch (variant) {
    case SignCodec::Variant::kSignSgd:
      info.name = "signsgd";
      info.id = CodecId::kSignSgd;
      info.majority_vote = true;
      info.shardable = true;
      break;
    case SignCodec::Variant::kEfSign:
      info.name = "efsign";
      info.id = CodecId::kEfSign;
      // The residual is the decorator's state.
      info.stateful = true;
      info.shardable = true;
      break;
    case SignCodec::Variant::kSignum:
      info.name = "signum";
      info.id = CodecId::kSignum;
      info.stateful = true;
      info.majority_vote = true;
      info.params = {"momentum"};
      break;
  }
  return info;
}

absl::StatusOr<std::unique_ptr<SingleRoundCodec>> SignCodec::Create(
    Variant variant, const CodecParams& params) {
  const CodecInfo info = SignInfo(variant);
  double momentum = 0;
  if (variant == Variant::kSignum) {
    GC_ASSIGN_OR_RETURN(momentum, params.GetDouble("momentum", 0.9));
    if (!(momentum >= 0.0 && momentum < 1.0)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "signum: momentum must be in [0, 1); got %g", momentum));
    }
  }
  GC_RETURN_IF_ERROR(params.CheckAllUsed(info.name));
  auto codec =
      std::make_unique<SignCodec>(variant, static_cast<float>(momentum));
  if (variant == Variant::kEfSign) {
    return std::unique_ptr<SingleRoundCodec>(
        std::make_unique<ErrorFeedback>(std::move(codec)));
  }
  return std::unique_ptr<SingleRoundCodec>(std::move(codec));
}

SignCodec::SignCodec(Variant variant, float momentum)
    : variant_(variant), momentum_(momentum), info_(SignInfo(variant)) {}

absl::Status SignCodec::Encode(const TensorView& grad, TensorState& state,
                               const StepContext& /*ctx*/,
                               Bytes* payload) const {
  const size_t n = grad.numel();
  absl::Span<const float> x = grad.values;
  absl::Span<float> momentum;
  if (variant_ == Variant::kSignum) {
    momentum = state.Buffer(kMomentumBuffer, n);
    UpdateMomentum(grad.values, momentum_, momentum);
    x = momentum;
  }
  WireHeader header;
  header.codec = info_.id;
  header.numel = n;
  char* body = BeginPayload(header, absl::string_view(), BodyBytes(n), payload);
  const double l1 = PackSigns(x, body + kScaleBytes);
  const float scale = n == 0 ? 0.0f : static_cast<float>(l1 / n);
  if (!std::isfinite(scale)) {
    // A momentum holding NaN would poison every later step.
    std::fill(momentum.begin(), momentum.end(), 0.0f);
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: the %s holds NaN or Inf; expected finite values", info_.name,
        variant_ == Variant::kSignum ? "momentum" : "gradient"));
  }
  std::memcpy(body, &scale, kScaleBytes);
  return absl::OkStatus();
}

absl::Status SignCodec::DecodeAdd(absl::string_view payload, float alpha,
                                  absl::Span<float> acc) const {
  GC_ASSIGN_OR_RETURN(const SignPayload p,
                      ParseSign(info_, payload, acc.size()));
  const float value = alpha * p.scale;
  AddSigns(p.signs, value, -value, acc);
  return absl::OkStatus();
}

absl::Status SignCodec::FinishGather(absl::Span<const Bytes> payloads,
                                     const StepContext& ctx,
                                     absl::Span<float> out) const {
  if (!info_.majority_vote) {
    return SingleRoundCodec::FinishGather(payloads, ctx, out);
  }
  if (payloads.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: expected at least one gathered payload, got none", info_.name));
  }
  // Every payload is checked before `out` is touched.
  std::vector<SignPayload> parsed;
  parsed.reserve(payloads.size());
  double scale_sum = 0;
  for (size_t r = 0; r < payloads.size(); ++r) {
    absl::StatusOr<SignPayload> p = ParseSign(info_, payloads[r], out.size());
    if (!p.ok()) {
      return absl::Status(p.status().code(),
                          absl::StrFormat("%s: payload of rank %d: %s",
                                          info_.name, r, p.status().message()));
    }
    scale_sum += p->scale;
    parsed.push_back(*p);
  }
  // `out` holds the tally sum_r sign_r; integers up to 2^24 workers are
  // exact in fp32.
  std::fill(out.begin(), out.end(), 0.0f);
  for (const SignPayload& p : parsed) AddSigns(p.signs, 1.0f, -1.0f, out);
  const float scale =
      static_cast<float>(scale_sum / static_cast<double>(payloads.size()));
  ParallelFor(out.size(), kParts, [&](size_t begin, size_t end, int) {
    for (size_t i = begin; i < end; ++i) {
      const float t = out[i];
      out[i] = t > 0.0f ? scale : (t < 0.0f ? -scale : 0.0f);
    }
  });
  return absl::OkStatus();
}

absl::Status RegisterSignCodecs(CodecRegistry& registry) {
  for (SignCodec::Variant variant :
       {SignCodec::Variant::kSignSgd, SignCodec::Variant::kEfSign,
        SignCodec::Variant::kSignum}) {
    CodecInfo info = SignInfo(variant);
    GC_RETURN_IF_ERROR(registry.Register(
        std::move(info),
        [variant](const CodecParams& params)
            -> absl::StatusOr<std::unique_ptr<Codec>> {
          GC_ASSIGN_OR_RETURN(std::unique_ptr<SingleRoundCodec> codec,
                              SignCodec::Create(variant, params));
          return std::unique_ptr<Codec>(std::move(codec));
        }));
  }
  return absl::OkStatus();
}

}  // namespace gradcomp::codecs
