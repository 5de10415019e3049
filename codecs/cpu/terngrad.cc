#include "codecs/cpu/terngrad.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "codecs/cpu/kernels.h"
#include "codecs/cpu/parallel.h"
#include "codecs/random.h"
#include "codecs/wire.h"

namespace gradcomp::codecs {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the payload is written with host-order memcpy");

constexpr size_t kParamBytes = 8;
constexpr int64_t kMaxBucket = int64_t{1} << 20;
// Elements quantised (and uniforms drawn) at a time; a multiple of 4 so that
// every chunk but the last fills whole code bytes.
constexpr size_t kChunk = 2048;
constexpr uint8_t kPlus = 1;
constexpr uint8_t kMinus = 2;

struct Layout {
  size_t buckets = 0;
  size_t code_bytes = 0;
  size_t body_bytes = 0;
};

Layout LayoutOf(size_t n, size_t bucket) {
  Layout layout;
  layout.buckets = (n + bucket - 1) / bucket;
  layout.code_bytes = (n + 3) / 4;
  layout.body_bytes = 4 * layout.buckets + layout.code_bytes;
  return layout;
}

struct EncodeJob {
  const float* x;
  size_t bucket;
  float clip;  // +inf when clipping is off
  const PhiloxStream* rng;
  char* scales;    // fp32 per bucket, unaligned
  uint8_t* codes;  // packed, 4 per byte
};

// Quantises [begin, end) (begin a multiple of 4 and of the bucket; end too,
// or the tensor's end). Returns false if a value is not finite.
bool EncodeRange(const EncodeJob& job, size_t begin, size_t end) {
  float uniforms[kChunk];
  uint8_t codes[kChunk];
  bool finite = true;
  size_t bucket_end = begin;
  float inverse = 0;
  for (size_t c0 = begin; c0 < end; c0 += kChunk) {
    const size_t c1 = std::min(c0 + kChunk, end);
    job.rng->FillUniform(c0, absl::MakeSpan(uniforms, c1 - c0));
    for (size_t i = c0; i < c1;) {
      if (i == bucket_end) {
        bucket_end = std::min(i + job.bucket, end);
        float largest = 0;
        bool nan = false;
        for (size_t j = i; j < bucket_end; ++j) {
          const float a = std::fabs(job.x[j]);
          largest = a > largest ? a : largest;
          nan |= a != a;
        }
        float scale = std::min(largest, job.clip);
        inverse = 1.0f / scale;
        const bool bucket_finite = !nan && std::isfinite(largest);
        finite = finite && bucket_finite;
        // A zero bucket, or a scale so small that 1 / s overflows: the
        // bucket goes as zeros (u < 0 never holds).
        if (!bucket_finite || !std::isfinite(inverse)) {
          scale = 0;
          inverse = 0;
        }
        std::memcpy(job.scales + 4 * (i / job.bucket), &scale, sizeof(scale));
      }
      const size_t stop = std::min(c1, bucket_end);
      for (; i < stop; ++i) {
        const float xi = job.x[i];
        const float p = std::min(std::fabs(xi), job.clip) * inverse;
        const uint8_t sign = std::signbit(xi) ? kMinus : kPlus;
        codes[i - c0] = uniforms[i - c0] < p ? sign : 0;
      }
    }
    uint8_t* out = job.codes + c0 / 4;
    const size_t count = c1 - c0;
    size_t i = 0;
    for (; i + 4 <= count; i += 4) {
      out[i / 4] = static_cast<uint8_t>(codes[i] | codes[i + 1] << 2 |
                                        codes[i + 2] << 4 | codes[i + 3] << 6);
    }
    if (i < count) {
      uint8_t last = 0;
      for (size_t j = 0; i + j < count; ++j) last |= codes[i + j] << (2 * j);
      out[i / 4] = last;
    }
  }
  return finite;
}

// Whether no 2-bit code in `codes` is 3 (both bits set).
bool CodesAreValid(const uint8_t* codes, size_t bytes) {
  constexpr uint64_t kLow = 0x5555555555555555ull;
  uint64_t bad = 0;
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t word;
    std::memcpy(&word, codes + i, sizeof(word));
    bad |= word & (word >> 1) & kLow;
  }
  for (; i < bytes; ++i) bad |= codes[i] & (codes[i] >> 1) & 0x55;
  return bad == 0;
}

ParallelOptions PartsFor(size_t bucket) {
  // Parts start on a bucket and on a byte of codes.
  return ParallelOptions{/*min_per_part=*/size_t{1} << 20,
                         /*align=*/bucket * 4};
}

absl::Status CheckBucket(int64_t bucket) {
  return CheckRange("terngrad", "bucket", bucket, 1, kMaxBucket);
}

}  // namespace

CodecInfo TernGradInfo() {
  CodecInfo info;
  info.name = "terngrad";
  info.id = CodecId::kTernGrad;
  info.family = "quantization";
  info.summable = false;
  info.unbiased = false;
  info.stateful = false;
  info.rounds = 1;
  info.shardable = true;
  info.params = {"bucket", "clip_sigma"};
  return info;
}

absl::StatusOr<std::unique_ptr<TernGradCodec>> TernGradCodec::Create(
    const CodecParams& params) {
  TernGradOptions o;
  GC_ASSIGN_OR_RETURN(o.bucket, params.GetInt("bucket", o.bucket));
  GC_ASSIGN_OR_RETURN(o.clip_sigma,
                      params.GetDouble("clip_sigma", o.clip_sigma));
  GC_RETURN_IF_ERROR(params.CheckAllUsed("terngrad"));
  GC_RETURN_IF_ERROR(CheckBucket(o.bucket));
  if (!(o.clip_sigma >= 0) || !std::isfinite(o.clip_sigma)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "terngrad: clip_sigma must be finite and >= 0 (0 = off); got %g",
        o.clip_sigma));
  }
  return std::make_unique<TernGradCodec>(o);
}

TernGradCodec::TernGradCodec(const TernGradOptions& options)
    : options_(options), info_(TernGradInfo()) {
  // Clipping biases the clipped values; without it E[Q(v)] = v.
  info_.unbiased = options.clip_sigma == 0;
}

absl::Status TernGradCodec::Encode(const TensorView& grad,
                                   TensorState& /*state*/,
                                   const StepContext& ctx,
                                   Bytes* payload) const {
  const size_t n = grad.numel();
  const size_t bucket = static_cast<size_t>(options_.bucket);
  const Layout layout = LayoutOf(n, bucket);
  const absl::Status non_finite = absl::InvalidArgumentError(
      "terngrad: the gradient holds NaN or Inf; expected finite values");

  float clip = std::numeric_limits<float>::infinity();
  if (options_.clip_sigma > 0 && n > 0) {
    const double sum_of_squares = SumOfSquares(grad.values);
    if (!std::isfinite(sum_of_squares)) return non_finite;
    clip =
        static_cast<float>(options_.clip_sigma * std::sqrt(sum_of_squares / n));
  }

  char params[kParamBytes] = {};
  const uint32_t bucket32 = static_cast<uint32_t>(bucket);
  std::memcpy(params, &bucket32, sizeof(bucket32));
  WireHeader header;
  header.codec = CodecId::kTernGrad;
  header.numel = n;
  char* body = BeginPayload(header, absl::string_view(params, kParamBytes),
                            layout.body_bytes, payload);
  const PhiloxStream rng = WorkerStream(ctx, /*round=*/0);
  const EncodeJob job{grad.values.data(),
                      bucket,
                      clip,
                      &rng,
                      body,
                      reinterpret_cast<uint8_t*>(body) + 4 * layout.buckets};
  const ParallelOptions parts = PartsFor(bucket);
  std::vector<char> finite(ParallelParts(n, parts), 1);
  ParallelFor(n, parts, [&](size_t begin, size_t end, int part) {
    finite[part] = EncodeRange(job, begin, end);
  });
  if (std::find(finite.begin(), finite.end(), 0) != finite.end()) {
    return non_finite;
  }
  return absl::OkStatus();
}

absl::StatusOr<TernGradPayload> ParseTernGradPayload(absl::string_view payload,
                                                     size_t n) {
  GC_ASSIGN_OR_RETURN(
      const ParsedPayload parsed,
      ParsePayload(payload, CodecId::kTernGrad, /*round=*/0, n));
  if (parsed.header.flags != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "terngrad: expected header flags 0 (not a dense body), got 0x%02x",
        parsed.header.flags));
  }
  if (parsed.params.size() != kParamBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("terngrad: expected %d parameter bytes, got %d",
                        kParamBytes, parsed.params.size()));
  }
  const char* p = parsed.params.data();
  uint32_t bucket32;
  std::memcpy(&bucket32, p, sizeof(bucket32));
  GC_RETURN_IF_ERROR(CheckBucket(bucket32));
  if (p[4] != 0 || p[5] != 0 || p[6] != 0 || p[7] != 0) {
    return absl::InvalidArgumentError(
        "terngrad: expected parameter bytes 4..7 to be zero");
  }
  const size_t bucket = bucket32;
  const Layout layout = LayoutOf(n, bucket);
  if (parsed.body.size() != layout.body_bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "terngrad: %d elements in buckets of %d need a body of %d bytes, got "
        "%d",
        n, bucket, layout.body_bytes, parsed.body.size()));
  }
  const char* scales = parsed.body.data();
  for (size_t b = 0; b < layout.buckets; ++b) {
    float scale;
    std::memcpy(&scale, scales + 4 * b, sizeof(scale));
    if (!(scale >= 0) || !std::isfinite(scale)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "terngrad: bucket %d has scale %g; expected a finite value >= 0", b,
          scale));
    }
  }
  const uint8_t* codes =
      reinterpret_cast<const uint8_t*>(scales) + 4 * layout.buckets;
  if (!CodesAreValid(codes, layout.code_bytes)) {
    return absl::InvalidArgumentError(
        "terngrad: expected 2-bit codes 0, 1 or 2; found a 3");
  }
  if (n % 4 != 0 && (codes[layout.code_bytes - 1] >> (2 * (n % 4))) != 0) {
    return absl::InvalidArgumentError(
        "terngrad: expected the padding bits of the last code byte to be zero");
  }
  return TernGradPayload{bucket, layout.buckets, parsed.body};
}

absl::Status TernGradCodec::DecodeAdd(absl::string_view payload, float alpha,
                                      absl::Span<float> acc) const {
  const size_t n = acc.size();
  GC_ASSIGN_OR_RETURN(const TernGradPayload p,
                      ParseTernGradPayload(payload, n));
  const size_t bucket = p.bucket;
  const char* scales = p.body.data();
  const uint8_t* codes =
      reinterpret_cast<const uint8_t*>(scales) + 4 * p.buckets;
  float* out = acc.data();
  ParallelFor(n, PartsFor(bucket), [&](size_t begin, size_t end, int) {
    for (size_t b0 = begin; b0 < end; b0 += bucket) {
      const size_t b1 = std::min(b0 + bucket, end);
      float scale;
      std::memcpy(&scale, scales + 4 * (b0 / bucket), sizeof(scale));
      scale *= alpha;
      for (size_t i = b0; i < b1; ++i) {
        const int code = (codes[i / 4] >> (2 * (i % 4))) & 3;
        // 1 -> +1, 2 -> -1, 0 -> 0, without a table lookup.
        out[i] += static_cast<float>((code & 1) - (code >> 1)) * scale;
      }
    }
  });
  return absl::OkStatus();
}

absl::Status RegisterTernGrad(CodecRegistry& registry) {
  return registry.Register(
      TernGradInfo(),
      [](const CodecParams& params) -> absl::StatusOr<std::unique_ptr<Codec>> {
        GC_ASSIGN_OR_RETURN(std::unique_ptr<TernGradCodec> codec,
                            TernGradCodec::Create(params));
        return std::unique_ptr<Codec>(std::move(codec));
      });
}

}  // namespace gradcomp::codecs
