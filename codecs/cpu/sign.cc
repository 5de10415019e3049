#include "codecs/cpu/sign.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "codecs/cpu/bitpack.h"
#include "codecs/cpu/kernels.h"
#include "codecs/cpu/parallel.h"
#include "codecs/error_feedback.h"
#include "codecs/wire.h"

namespace gradcomp::codecs {
namespace {

constexpr size_t kScaleBytes = 4;
constexpr size_t kParamBytes = 8;  // efsign with buckets: u32 d, 4 zero bytes
constexpr int64_t kMaxBucket = int64_t{1} << 20;
constexpr ParallelOptions kParts{/*min_per_part=*/size_t{1} << 20,
                                 /*align=*/64};

// Scales of n values in buckets of d (0: one for the whole payload).
size_t ScaleCount(size_t n, size_t bucket) {
  return bucket == 0 ? 1 : (n + bucket - 1) / bucket;
}

size_t BodyBytes(size_t n, size_t bucket) {
  return kScaleBytes * ScaleCount(n, bucket) + SignBytes(n);
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
      // Not shardable: an owner's re-encode of its slice's vote, {-s, 0, +s}
      // (a tie is 0 when W is even), in one bit per value would send ties
      // as +s and scale the rest by the share of non-ties.
      break;
    case SignCodec::Variant::kEfSign:
      info.name = "efsign";
      info.id = CodecId::kEfSign;
      info.params = {"bucket"};
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

namespace {

// SignInfo(variant), built once: ParseSignPayload runs on every decode and
// needs only the name and id.
const CodecInfo& CachedSignInfo(SignCodec::Variant variant) {
  static const CodecInfo* const infos[] = {
      new CodecInfo(SignInfo(SignCodec::Variant::kSignSgd)),
      new CodecInfo(SignInfo(SignCodec::Variant::kEfSign)),
      new CodecInfo(SignInfo(SignCodec::Variant::kSignum))};
  return *infos[static_cast<int>(variant)];
}

}  // namespace

absl::StatusOr<SignPayload> ParseSignPayload(SignCodec::Variant variant,
                                             absl::string_view payload,
                                             size_t n) {
  const CodecInfo& info = CachedSignInfo(variant);
  GC_ASSIGN_OR_RETURN(const ParsedPayload parsed,
                      ParsePayload(payload, info.id, /*round=*/0, n));
  if (parsed.header.flags != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: expected header flags 0 (not a dense body), got 0x%02x", info.name,
        parsed.header.flags));
  }
  SignPayload out;
  if (!parsed.params.empty()) {
    // Only efsign sends buckets.
    if (info.id != CodecId::kEfSign || parsed.params.size() != kParamBytes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: expected %s parameter bytes, got %d", info.name,
          info.id == CodecId::kEfSign ? "0 or 8" : "no", parsed.params.size()));
    }
    uint32_t bucket32 = 0;
    uint32_t zero = 0;
    std::memcpy(&bucket32, parsed.params.data(), sizeof(bucket32));
    std::memcpy(&zero, parsed.params.data() + 4, sizeof(zero));
    GC_RETURN_IF_ERROR(
        CheckRange(info.name, "bucket", bucket32, 64, kMaxBucket));
    if (bucket32 % 64 != 0 || zero != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: expected a bucket that is a multiple of 64 and zero bytes "
          "[4..7] in the parameters, got bucket %d and 0x%08x",
          info.name, bucket32, zero));
    }
    out.bucket = bucket32;
  }
  const size_t body_bytes = BodyBytes(n, out.bucket);
  if (parsed.body.size() != body_bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: %d elements need a body of %d bytes (scales + signs), got %d",
        info.name, n, body_bytes, parsed.body.size()));
  }
  out.scales.resize(ScaleCount(n, out.bucket));
  // An empty tensor in buckets has no scales, and memcpy of an empty vector's
  // data() (null) is undefined even for 0 bytes.
  if (!out.scales.empty()) {
    std::memcpy(out.scales.data(), parsed.body.data(),
                kScaleBytes * out.scales.size());
  }
  for (float scale : out.scales) {
    if (!(scale >= 0) || !std::isfinite(scale)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: expected a finite scale >= 0, got %g", info.name, scale));
    }
  }
  out.body = parsed.body;
  if (!SignPaddingIsZero(out.signs(), n)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: expected the padding bits after %d signs to be zero", info.name,
        n));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<SingleRoundCodec>> SignCodec::Create(
    Variant variant, const CodecParams& params) {
  const CodecInfo info = SignInfo(variant);
  double momentum = 0;
  int64_t bucket = 0;
  if (variant == Variant::kEfSign) {
    GC_ASSIGN_OR_RETURN(bucket, params.GetInt("bucket", 0));
    if (bucket != 0 &&
        (bucket < 64 || bucket > kMaxBucket || bucket % 64 != 0)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "efsign: bucket must be 0 (one scale per tensor) or a multiple of "
          "64 in [64, %d]; got %d",
          kMaxBucket, bucket));
    }
  }
  if (variant == Variant::kSignum) {
    GC_ASSIGN_OR_RETURN(momentum, params.GetDouble("momentum", 0.9));
    if (!(momentum >= 0.0 && momentum < 1.0)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "signum: momentum must be in [0, 1); got %g", momentum));
    }
  }
  GC_RETURN_IF_ERROR(params.CheckAllUsed(info.name));
  auto codec = std::make_unique<SignCodec>(
      variant, static_cast<float>(momentum), bucket);
  if (variant == Variant::kEfSign) {
    return std::unique_ptr<SingleRoundCodec>(
        std::make_unique<ErrorFeedback>(std::move(codec)));
  }
  return std::unique_ptr<SingleRoundCodec>(std::move(codec));
}

SignCodec::SignCodec(Variant variant, float momentum, int64_t bucket)
    : variant_(variant),
      momentum_(momentum),
      bucket_(bucket),
      info_(SignInfo(variant)) {}

void SignCodec::Revert(const TensorView& grad, TensorState& state,
                       const StepContext& /*ctx*/,
                       absl::string_view /*payload*/) const {
  if (variant_ != Variant::kSignum) return;
  absl::Span<float> m = state.Buffer(kMomentumBuffer, grad.numel());
  const float beta = momentum_;
  const float rest = 1.0f - beta;
  ParallelFor(m.size(), kParts, [&](size_t begin, size_t end, int) {
    for (size_t i = begin; i < end; ++i) {
      // With beta = 0 the old m never mattered: it restarts from zero.
      m[i] = beta == 0 ? 0.0f
                       : FiniteOrZero((m[i] - rest * grad.values[i]) / beta);
    }
  });
}

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
  const size_t bucket = static_cast<size_t>(bucket_);
  char params[kParamBytes] = {};
  const uint32_t bucket32 = static_cast<uint32_t>(bucket);
  std::memcpy(params, &bucket32, sizeof(bucket32));
  char* body = BeginPayload(
      header, absl::string_view(params, bucket == 0 ? 0 : kParamBytes),
      BodyBytes(n, bucket), payload);
  const size_t scales = ScaleCount(n, bucket);
  char* signs = body + kScaleBytes * scales;
  // Buckets are whole 64-bit words of signs: bucket b's start at word
  // b * d / 64.
  const size_t span = bucket == 0 ? n : bucket;
  for (size_t b = 0; b < scales; ++b) {
    const size_t begin = b * span;
    const size_t len = std::min(span, n - begin);
    const double l1 = PackSigns(x.subspan(begin, len), signs + begin / 8);
    const float scale = len == 0 ? 0.0f : static_cast<float>(l1 / len);
    if (!std::isfinite(scale)) {
      // A momentum holding NaN would poison every later step.
      std::fill(momentum.begin(), momentum.end(), 0.0f);
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: the %s holds NaN or Inf; expected finite values", info_.name,
          variant_ == Variant::kSignum ? "momentum" : "gradient"));
    }
    std::memcpy(body + kScaleBytes * b, &scale, kScaleBytes);
  }
  return absl::OkStatus();
}

absl::Status SignCodec::DecodeAdd(absl::string_view payload, float alpha,
                                  absl::Span<float> acc) const {
  GC_ASSIGN_OR_RETURN(const SignPayload p,
                      ParseSignPayload(variant_, payload, acc.size()));
  const size_t span = p.bucket == 0 ? acc.size() : p.bucket;
  for (size_t b = 0; b < p.scales.size(); ++b) {
    const size_t begin = b * span;
    const float value = alpha * p.scales[b];
    AddSigns(p.signs() + begin / 8, value, -value,
             acc.subspan(begin, std::min(span, acc.size() - begin)));
  }
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
    absl::StatusOr<SignPayload> p =
        ParseSignPayload(variant_, payloads[r], out.size());
    if (!p.ok()) {
      return absl::Status(p.status().code(),
                          absl::StrFormat("%s: payload of rank %d: %s",
                                          info_.name, r, p.status().message()));
    }
    scale_sum += p->scales[0];
    parsed.push_back(*p);
  }
  // `out` holds the tally sum_r sign_r; integers up to 2^24 workers are
  // exact in fp32.
  std::fill(out.begin(), out.end(), 0.0f);
  for (const SignPayload& p : parsed) AddSigns(p.signs(), 1.0f, -1.0f, out);
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
