#include "codecs/cpu/int8.h"

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
constexpr uint8_t kNearest = 0;
constexpr uint8_t kStochastic = 1;
// Uniforms drawn at a time for stochastic rounding.
constexpr size_t kChunk = 2048;

// Level arithmetic of one bucket, shared by encoder and decoder so that
// DecodeOwn reproduces exactly what the encoder meant.
struct BucketScale {
  float step = 0;     // (max - min) / 255
  float inverse = 0;  // 255 / (max - min); 0 for a constant bucket
  // Decoding evaluates (min / unit + q * step / unit) * unit: 1, or 2 when
  // max - min exceeds FLT_MAX, where q * step itself would overflow.
  float unit = 1;
};

BucketScale ScaleOf(float lo, float hi) {
  const double range = static_cast<double>(hi) - static_cast<double>(lo);
  BucketScale s;
  s.step = static_cast<float>(range / 255.0);
  if (range > std::numeric_limits<float>::max()) s.unit = 2;
  s.inverse = range > 0 ? static_cast<float>(255.0 / range) : 0.0f;
  // A subnormal range overflows 255 / range: the bucket goes as its min.
  if (!std::isfinite(s.inverse)) s.inverse = 0;
  return s;
}

size_t BucketsOf(size_t n, size_t bucket) { return (n + bucket - 1) / bucket; }

struct EncodeJob {
  const float* x;
  size_t bucket;
  const PhiloxStream* rng;  // nullptr: round to nearest
  char* ranges;             // (min, max) fp32 pairs, unaligned
  uint8_t* codes;
};

// Quantises the buckets of [begin, end); false if a value is not finite.
bool EncodeRange(const EncodeJob& job, size_t begin, size_t end) {
  float uniforms[kChunk];
  bool finite = true;
  for (size_t b0 = begin; b0 < end; b0 += job.bucket) {
    const size_t b1 = std::min(b0 + job.bucket, end);
    const float* x = job.x + b0;
    const size_t len = b1 - b0;
    float lo = x[0];
    float hi = x[0];
    bool nan = false;
    for (size_t i = 0; i < len; ++i) {
      lo = x[i] < lo ? x[i] : lo;
      hi = x[i] > hi ? x[i] : hi;
      nan |= x[i] != x[i];
    }
    if (nan || !std::isfinite(lo) || !std::isfinite(hi)) {
      finite = false;
      lo = hi = 0;
    }
    std::memcpy(job.ranges + 8 * (b0 / job.bucket), &lo, 4);
    std::memcpy(job.ranges + 8 * (b0 / job.bucket) + 4, &hi, 4);
    const BucketScale s = ScaleOf(lo, hi);
    // The level from x - lo, not x * inverse - lo * inverse: where the
    // bucket sits far from 0 next to its range, those two products round by
    // whole levels and cancel, and the rounding is no longer unbiased. Both
    // halved where the range passes FLT_MAX, so the difference stays finite.
    const float half = 1.0f / s.unit;
    const float lo_half = lo * half;
    const float inverse_half = s.inverse * s.unit;
    uint8_t* q = job.codes + b0;
    if (s.inverse == 0) {
      std::fill(q, q + len, 0);
      continue;
    }
    if (job.rng == nullptr) {
      for (size_t i = 0; i < len; ++i) {
        const float level =
            std::max((x[i] * half - lo_half) * inverse_half, 0.0f) + 0.5f;
        q[i] = static_cast<uint8_t>(std::min(level, 255.0f));
      }
      continue;
    }
    for (size_t c0 = 0; c0 < len; c0 += kChunk) {
      const size_t c1 = std::min(c0 + kChunk, len);
      job.rng->FillUniform(b0 + c0, absl::MakeSpan(uniforms, c1 - c0));
      for (size_t i = c0; i < c1; ++i) {
        const float level =
            std::max((x[i] * half - lo_half) * inverse_half, 0.0f) +
            uniforms[i - c0];
        q[i] = static_cast<uint8_t>(std::min(level, 255.0f));
      }
    }
  }
  return finite;
}

ParallelOptions PartsFor(size_t bucket) {
  return ParallelOptions{/*min_per_part=*/size_t{1} << 20, /*align=*/bucket};
}

absl::Status CheckBucket(int64_t bucket) {
  return CheckRange("int8", "bucket", bucket, 1, kMaxBucket);
}

}  // namespace

CodecInfo Int8Info() {
  CodecInfo info;
  info.name = "int8";
  info.id = CodecId::kInt8;
  info.family = "quantization";
  info.summable = false;
  info.unbiased = false;
  info.stateful = false;
  info.rounds = 1;
  info.shardable = true;
  info.params = {"bucket", "stochastic"};
  return info;
}

absl::StatusOr<std::unique_ptr<Int8Codec>> Int8Codec::Create(
    const CodecParams& params) {
  Int8Options o;
  GC_ASSIGN_OR_RETURN(o.bucket, params.GetInt("bucket", o.bucket));
  GC_ASSIGN_OR_RETURN(o.stochastic, params.GetBool("stochastic", o.stochastic));
  GC_RETURN_IF_ERROR(params.CheckAllUsed("int8"));
  GC_RETURN_IF_ERROR(CheckBucket(o.bucket));
  return std::make_unique<Int8Codec>(o);
}

Int8Codec::Int8Codec(const Int8Options& options)
    : options_(options), info_(Int8Info()) {
  info_.unbiased = options.stochastic;
}

absl::Status Int8Codec::Encode(const TensorView& grad, TensorState& /*state*/,
                               const StepContext& ctx, Bytes* payload) const {
  const size_t n = grad.numel();
  const size_t bucket = static_cast<size_t>(options_.bucket);
  const size_t buckets = BucketsOf(n, bucket);
  char params[kParamBytes] = {};
  const uint32_t bucket32 = static_cast<uint32_t>(bucket);
  std::memcpy(params, &bucket32, sizeof(bucket32));
  params[4] = static_cast<char>(options_.stochastic ? kStochastic : kNearest);
  WireHeader header;
  header.codec = CodecId::kInt8;
  header.numel = n;
  char* body = BeginPayload(header, absl::string_view(params, kParamBytes),
                            8 * buckets + n, payload);
  const PhiloxStream rng = WorkerStream(ctx, /*round=*/0);
  const EncodeJob job{grad.values.data(), bucket,
                      options_.stochastic ? &rng : nullptr, body,
                      reinterpret_cast<uint8_t*>(body) + 8 * buckets};
  const ParallelOptions parts = PartsFor(bucket);
  std::vector<char> finite(ParallelParts(n, parts), 1);
  ParallelFor(n, parts, [&](size_t begin, size_t end, int part) {
    finite[part] = EncodeRange(job, begin, end);
  });
  if (std::find(finite.begin(), finite.end(), 0) != finite.end()) {
    return absl::InvalidArgumentError(
        "int8: the gradient holds NaN or Inf; expected finite values");
  }
  return absl::OkStatus();
}

absl::StatusOr<Int8Payload> ParseInt8Payload(absl::string_view payload,
                                             size_t n) {
  GC_ASSIGN_OR_RETURN(const ParsedPayload parsed,
                      ParsePayload(payload, CodecId::kInt8, /*round=*/0, n));
  if (parsed.header.flags != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "int8: expected header flags 0 (not a dense body), got 0x%02x",
        parsed.header.flags));
  }
  if (parsed.params.size() != kParamBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("int8: expected %d parameter bytes, got %d",
                        kParamBytes, parsed.params.size()));
  }
  const char* p = parsed.params.data();
  uint32_t bucket32;
  std::memcpy(&bucket32, p, sizeof(bucket32));
  GC_RETURN_IF_ERROR(CheckBucket(bucket32));
  const uint8_t rounding = static_cast<uint8_t>(p[4]);
  if (rounding > kStochastic || p[5] != 0 || p[6] != 0 || p[7] != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "int8: expected rounding 0 or 1 and zero parameter bytes 5..7; got "
        "rounding %d",
        rounding));
  }
  const size_t bucket = bucket32;
  const size_t buckets = BucketsOf(n, bucket);
  if (parsed.body.size() != 8 * buckets + n) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "int8: %d elements in buckets of %d need a body of %d bytes, got %d", n,
        bucket, 8 * buckets + n, parsed.body.size()));
  }
  const char* ranges = parsed.body.data();
  for (size_t b = 0; b < buckets; ++b) {
    float lo, hi;
    std::memcpy(&lo, ranges + 8 * b, 4);
    std::memcpy(&hi, ranges + 8 * b + 4, 4);
    if (!std::isfinite(lo) || !std::isfinite(hi) || !(lo <= hi)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "int8: bucket %d has min %g and max %g; expected finite min <= max",
          b, lo, hi));
    }
  }
  return Int8Payload{bucket, rounding == kStochastic, buckets, parsed.body};
}

absl::Status Int8Codec::DecodeAdd(absl::string_view payload, float alpha,
                                  absl::Span<float> acc) const {
  const size_t n = acc.size();
  GC_ASSIGN_OR_RETURN(const Int8Payload parsed, ParseInt8Payload(payload, n));
  const size_t bucket = parsed.bucket;
  const char* ranges = parsed.body.data();
  const uint8_t* codes =
      reinterpret_cast<const uint8_t*>(ranges) + 8 * parsed.buckets;
  float* out = acc.data();
  ParallelFor(n, PartsFor(bucket), [&](size_t begin, size_t end, int) {
    for (size_t b0 = begin; b0 < end; b0 += bucket) {
      const size_t b1 = std::min(b0 + bucket, end);
      float lo, hi;
      std::memcpy(&lo, ranges + 8 * (b0 / bucket), 4);
      std::memcpy(&hi, ranges + 8 * (b0 / bucket) + 4, 4);
      const BucketScale s = ScaleOf(lo, hi);
      // Division and multiplication by a power of two are exact: with
      // unit 1 this is alpha * (min + q * step).
      const float base = alpha * lo / s.unit;
      const float step = alpha * s.step / s.unit;
      const float unit = s.unit;
      for (size_t i = b0; i < b1; ++i) {
        out[i] += (base + static_cast<float>(codes[i]) * step) * unit;
      }
    }
  });
  return absl::OkStatus();
}

absl::Status RegisterInt8(CodecRegistry& registry) {
  return registry.Register(
      Int8Info(),
      [](const CodecParams& params) -> absl::StatusOr<std::unique_ptr<Codec>> {
        GC_ASSIGN_OR_RETURN(std::unique_ptr<Int8Codec> codec,
                            Int8Codec::Create(params));
        return std::unique_ptr<Codec>(std::move(codec));
      });
}

}  // namespace gradcomp::codecs
