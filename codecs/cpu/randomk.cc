#include "codecs/cpu/randomk.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "codecs/error_feedback.h"
#include "codecs/wire.h"

namespace gradcomp::codecs {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the payload is written with host-order memcpy");

// Parameter block (docs/wire-format.md): [0] element type f32, [1] index draw
// algorithm, [2..7] zero, then u64 k, u64 seed, u64 tensor id, i64 step: the
// key that lets any decoder draw the indices again.
constexpr size_t kParamBytes = 40;
constexpr uint8_t kFloydPhilox = 1;

bool IsFinite(float x) {
  return std::fabs(x) <= std::numeric_limits<float>::max();
}

uint64_t Load64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// Calls fn(j, index) for the j-th set bit, in ascending order of index.
template <typename Fn>
void ForEachIndex(const std::vector<uint64_t>& bitmap, Fn&& fn) {
  uint64_t j = 0;
  for (size_t w = 0; w < bitmap.size(); ++w) {
    for (uint64_t word = bitmap[w]; word != 0; word &= word - 1) {
      fn(j++, w * 64 + static_cast<uint64_t>(__builtin_ctzll(word)));
    }
  }
}

}  // namespace

std::vector<uint64_t> DrawRandomKBitmap(uint64_t n, uint64_t k,
                                        const PhiloxStream& rng) {
  std::vector<uint64_t> bitmap((n + 63) / 64, 0);
  // Drawing the smaller of the set and its complement keeps ratio 1 free.
  const bool complement = k > n - k;
  const uint64_t m = complement ? n - k : k;
  uint64_t words[4];
  for (uint64_t t = 0; t < m; ++t) {
    if (t % 4 == 0) rng.Block(t / 4, words);
    const uint64_t j = n - m + t;
    // Uniform in [0, j] by multiply-shift: one 64-bit word, no rejection
    // loop, the same on a GPU (__umul64hi).
    const uint64_t r = static_cast<uint64_t>(
        (static_cast<unsigned __int128>(words[t % 4]) * (j + 1)) >> 64);
    // Floyd: every earlier mark is below j, so j itself is always free.
    const uint64_t pick = ((bitmap[r >> 6] >> (r & 63)) & 1) != 0 ? j : r;
    bitmap[pick >> 6] |= uint64_t{1} << (pick & 63);
  }
  if (complement) {
    for (uint64_t& word : bitmap) word = ~word;
    if (n % 64 != 0) bitmap.back() &= (uint64_t{1} << (n % 64)) - 1;
  }
  return bitmap;
}

CodecInfo RandomKInfo() {
  CodecInfo info;
  info.name = "randomk";
  info.id = CodecId::kRandomK;
  info.family = "sparsification";
  info.summable = true;
  info.unbiased = true;
  info.stateful = false;
  info.rounds = 1;
  info.params = {"error_feedback", "ratio", "scale"};
  return info;
}

absl::StatusOr<RandomKOptions> RandomKCodec::ParseOptions(
    const CodecParams& params, bool error_feedback) {
  RandomKOptions o;
  GC_ASSIGN_OR_RETURN(o.ratio, params.GetDouble("ratio", o.ratio));
  GC_ASSIGN_OR_RETURN(o.scale, params.GetBool("scale", !error_feedback));
  if (!(o.ratio > 0 && o.ratio <= 1)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "randomk: parameter 'ratio' must be in (0, 1]; got %g", o.ratio));
  }
  if (error_feedback && o.scale) {
    return absl::InvalidArgumentError(
        "randomk: expected scale=false with error_feedback=true (the scaled "
        "estimate's error exceeds the input, so the residual would grow); got "
        "scale=true");
  }
  return o;
}

RandomKCodec::RandomKCodec(const RandomKOptions& options)
    : options_(options), info_(RandomKInfo()) {
  info_.unbiased = options.scale;
}

PhiloxStream RandomKStream(const StepContext& ctx) {
  return PhiloxStream(ctx.seed, ctx.tensor_id, ctx.step, /*round=*/0);
}

char* BeginRandomKPayload(uint64_t n, uint64_t k, const StepContext& ctx,
                          Bytes* payload) {
  char params[kParamBytes] = {static_cast<char>(ElemType::kF32),
                              static_cast<char>(kFloydPhilox)};
  const uint64_t key[4] = {k, ctx.seed, ctx.tensor_id,
                           static_cast<uint64_t>(ctx.step)};
  std::memcpy(params + 8, key, sizeof(key));
  WireHeader header;
  header.codec = CodecId::kRandomK;
  header.flags = kFlagDenseBody;
  header.numel = n;
  return BeginPayload(header, absl::string_view(params, kParamBytes),
                      k * sizeof(float), payload);
}

uint64_t RandomKCodec::KFor(uint64_t numel) const {
  if (numel == 0) return 0;
  // The 1e-9 absorbs the rounding of ratio * numel (0.01 * 25e6 is not
  // exactly 250000 in double), which would otherwise add one.
  const double k =
      std::ceil(options_.ratio * static_cast<double>(numel) - 1e-9);
  return static_cast<uint64_t>(std::clamp(k, 1.0, static_cast<double>(numel)));
}

float RandomKCodec::ScaleFor(uint64_t numel) const {
  const uint64_t k = KFor(numel);
  return options_.scale && k > 0
             ? static_cast<float>(static_cast<double>(numel) /
                                  static_cast<double>(k))
             : 1.0f;
}

absl::Status RandomKCodec::Encode(const TensorView& grad,
                                  TensorState& /*state*/,
                                  const StepContext& ctx,
                                  Bytes* payload) const {
  const uint64_t n = grad.numel();
  const uint64_t k = KFor(n);
  const float scale = ScaleFor(n);
  char* body = BeginRandomKPayload(n, k, ctx, payload);
  const std::vector<uint64_t> bitmap =
      DrawRandomKBitmap(n, k, RandomKStream(ctx));
  const float* g = grad.values.data();
  uint64_t bad = n;  // the first index whose value is not finite
  ForEachIndex(bitmap, [&](uint64_t j, uint64_t i) {
    const float value = g[i] * scale;
    if (!IsFinite(value) && bad == n) bad = i;
    std::memcpy(body + sizeof(float) * j, &value, sizeof(value));
  });
  // Decoders refuse a value that is not finite; say so here, where it is
  // known why.
  if (bad != n) return RandomKNonFiniteValue(bad, g[bad] * scale, scale);
  return absl::OkStatus();
}

absl::Status RandomKNonFiniteValue(uint64_t index, float value, float scale) {
  return absl::InvalidArgumentError(absl::StrFormat(
      "randomk: the value sent for index %d (the gradient times %g) is %g; "
      "expected finite values",
      index, scale, value));
}

absl::StatusOr<RandomKPayload> ParseRandomKPayload(absl::string_view payload,
                                                   uint64_t n) {
  GC_ASSIGN_OR_RETURN(const ParsedPayload parsed,
                      ParsePayload(payload, CodecId::kRandomK, /*round=*/0, n));
  if (parsed.header.flags != kFlagDenseBody) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "randomk: expected header flags 0x01 (dense body), got 0x%02x",
        parsed.header.flags));
  }
  if (parsed.params.size() != kParamBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("randomk: expected %d parameter bytes, got %d",
                        kParamBytes, parsed.params.size()));
  }
  const char* p = parsed.params.data();
  if (static_cast<uint8_t>(p[0]) != static_cast<uint8_t>(ElemType::kF32) ||
      static_cast<uint8_t>(p[1]) != kFloydPhilox ||
      std::any_of(p + 2, p + 8, [](char c) { return c != 0; })) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "randomk: expected parameter bytes 0..7 to be 1 (f32), %d (Floyd "
        "draw), then zeros; got %d, %d, ...",
        kFloydPhilox, static_cast<uint8_t>(p[0]), static_cast<uint8_t>(p[1])));
  }
  const uint64_t k = Load64(p + 8);
  if (k > n) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "randomk: payload claims k = %d values of a %d-element tensor", k, n));
  }
  if (parsed.body.size() != k * sizeof(float)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "randomk: k = %d values need a body of %d bytes, got %d", k,
        k * sizeof(float), parsed.body.size()));
  }
  // Encoders refuse NaN and Inf (as the daemon refuses them from clients),
  // so a peer's non-finite value is a bad payload, not a gradient.
  for (uint64_t j = 0; j < k; ++j) {
    float value;
    std::memcpy(&value, parsed.body.data() + sizeof(float) * j, sizeof(value));
    if (!IsFinite(value)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "randomk: value %d of %d is %g; expected finite values", j, k,
          value));
    }
  }
  return RandomKPayload{k,
                        PhiloxStream(Load64(p + 16), Load64(p + 24),
                                     static_cast<int64_t>(Load64(p + 32)),
                                     /*round=*/0),
                        parsed.body};
}

absl::Status RandomKCodec::DecodeAdd(absl::string_view payload, float alpha,
                                     absl::Span<float> acc) const {
  const uint64_t n = acc.size();
  GC_ASSIGN_OR_RETURN(const RandomKPayload p, ParseRandomKPayload(payload, n));
  const std::vector<uint64_t> bitmap = DrawRandomKBitmap(n, p.k, p.rng);
  const char* body = p.values.data();
  float* out = acc.data();
  ForEachIndex(bitmap, [&](uint64_t j, uint64_t i) {
    float value;
    std::memcpy(&value, body + sizeof(float) * j, sizeof(value));
    out[i] += alpha * value;
  });
  return absl::OkStatus();
}

absl::Status RandomKCodec::FinishSum(absl::Span<const float> sum,
                                     int world_size, const StepContext& ctx,
                                     absl::Span<float> out) const {
  if (world_size < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "randomk: expected a world size >= 1, got %d", world_size));
  }
  const uint64_t k = KFor(out.size());
  if (sum.size() != k) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "randomk: expected a sum of k = %d values for %d elements, got %d", k,
        out.size(), sum.size()));
  }
  const std::vector<uint64_t> bitmap =
      DrawRandomKBitmap(out.size(), k, RandomKStream(ctx));
  std::fill(out.begin(), out.end(), 0.0f);
  const float w = static_cast<float>(world_size);
  ForEachIndex(bitmap, [&](uint64_t j, uint64_t i) { out[i] = sum[j] / w; });
  return absl::OkStatus();
}

absl::Status RegisterRandomK(CodecRegistry& registry) {
  return registry.Register(
      RandomKInfo(),
      [](const CodecParams& params) -> absl::StatusOr<std::unique_ptr<Codec>> {
        GC_ASSIGN_OR_RETURN(const bool error_feedback,
                            params.GetBool("error_feedback", false));
        GC_ASSIGN_OR_RETURN(const RandomKOptions options,
                            RandomKCodec::ParseOptions(params, error_feedback));
        GC_RETURN_IF_ERROR(params.CheckAllUsed("randomk"));
        auto codec = std::make_unique<RandomKCodec>(options);
        if (!error_feedback) return std::unique_ptr<Codec>(std::move(codec));
        return std::unique_ptr<Codec>(
            std::make_unique<ErrorFeedback>(std::move(codec)));
      });
}

}  // namespace gradcomp::codecs
