#include "codecs/cpu/qsgd.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
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
constexpr int kMinBits = 2;
constexpr int kMaxBits = 8;
// Elements quantised (and uniforms drawn) at a time; a multiple of 8 so that
// every chunk but the last fills whole bytes whatever the width.
constexpr size_t kChunk = 2048;

struct Layout {
  uint64_t buckets = 0;
  uint64_t code_bytes = 0;
  uint64_t body_bytes = 0;
};

Layout LayoutOf(uint64_t n, uint64_t bucket, int bits) {
  Layout layout;
  layout.buckets = (n + bucket - 1) / bucket;
  layout.code_bytes = (n * bits + 7) / 8;
  layout.body_bytes = 4 * layout.buckets + layout.code_bytes;
  return layout;
}

// Packs count b-bit codes (one per byte of `codes`) into ceil(count*B/8)
// bytes, a group of 8 codes (B bytes) at a time.
template <int B>
void Pack(const uint8_t* codes, size_t count, uint8_t* out) {
  size_t i = 0;
  for (; i + 8 <= count; i += 8, out += B) {
    uint64_t word = 0;
    for (int j = 0; j < 8; ++j) word |= uint64_t{codes[i + j]} << (B * j);
    std::memcpy(out, &word, B);
  }
  if (i == count) return;
  uint64_t word = 0;
  for (size_t j = 0; i + j < count; ++j)
    word |= uint64_t{codes[i + j]} << (B * j);
  std::memcpy(out, &word, ((count - i) * B + 7) / 8);
}

// The inverse of Pack.
template <int B>
void Unpack(const uint8_t* in, size_t count, uint8_t* codes) {
  constexpr uint64_t kMask = (uint64_t{1} << B) - 1;
  size_t i = 0;
  for (; i + 8 <= count; i += 8, in += B) {
    uint64_t word = 0;
    std::memcpy(&word, in, B);
    for (int j = 0; j < 8; ++j) codes[i + j] = (word >> (B * j)) & kMask;
  }
  if (i == count) return;
  uint64_t word = 0;
  std::memcpy(&word, in, ((count - i) * B + 7) / 8);
  for (size_t j = 0; i + j < count; ++j)
    codes[i + j] = (word >> (B * j)) & kMask;
}

struct EncodeJob {
  const float* x;
  size_t bucket;
  int levels;
  const PhiloxStream* rng;
  char* norms;     // fp32 per bucket, unaligned
  uint8_t* codes;  // packed
};

// Quantises [begin, end) (begin a multiple of 8 and of the bucket; end too,
// or the tensor's end). Returns false if a bucket's norm is not finite.
template <int B>
bool EncodeRange(const EncodeJob& job, size_t begin, size_t end) {
  constexpr uint8_t kSign = 1 << (B - 1);
  float uniforms[kChunk];
  uint8_t codes[kChunk];
  bool finite = true;
  size_t bucket_end = begin;
  float scale = 0;
  for (size_t c0 = begin; c0 < end; c0 += kChunk) {
    const size_t c1 = std::min(c0 + kChunk, end);
    job.rng->FillUniform(c0, absl::MakeSpan(uniforms, c1 - c0));
    for (size_t i = c0; i < c1;) {
      if (i == bucket_end) {
        bucket_end = std::min(i + job.bucket, end);
        float norm = BucketNorm(absl::MakeConstSpan(job.x + i, bucket_end - i));
        scale = static_cast<float>(job.levels) / norm;
        if (!std::isfinite(norm)) finite = false;
        // A zero, non-finite, or so small a norm that s / norm overflows:
        // the bucket goes as zeros (a subnormal-scale bucket is lost).
        if (!std::isfinite(scale) || !std::isfinite(norm)) {
          scale = 0;
          norm = 0;
        }
        std::memcpy(job.norms + 4 * (i / job.bucket), &norm, sizeof(norm));
      }
      const size_t stop = std::min(c1, bucket_end);
      if (scale == 0) {
        std::fill(codes + (i - c0), codes + (stop - c0), 0);
        i = stop;
        continue;
      }
      for (; i < stop; ++i) {
        const float xi = job.x[i];
        // |xi| * scale <= s up to rounding, and uniforms < 1: no overflow.
        const float raised = std::fabs(xi) * scale + uniforms[i - c0];
        const uint8_t level = static_cast<uint8_t>(
            std::min(static_cast<int>(raised), job.levels));
        codes[i - c0] = level | (std::signbit(xi) ? kSign : 0);
      }
    }
    Pack<B>(codes, c1 - c0, job.codes + (c0 / 8) * B);
  }
  return finite;
}

struct DecodeJob {
  const char* norms;
  const uint8_t* codes;
  size_t bucket;
  int levels;
  float alpha;
  float* acc;
};

template <int B>
void DecodeRange(const DecodeJob& job, size_t begin, size_t end) {
  constexpr uint8_t kSign = 1 << (B - 1);
  constexpr uint8_t kLevel = kSign - 1;
  uint8_t codes[kChunk];
  for (size_t c0 = begin; c0 < end; c0 += kChunk) {
    const size_t c1 = std::min(c0 + kChunk, end);
    Unpack<B>(job.codes + (c0 / 8) * B, c1 - c0, codes);
    for (size_t i = c0; i < c1;) {
      const size_t b = i / job.bucket;
      const size_t stop = std::min(c1, (b + 1) * job.bucket);
      float norm;
      std::memcpy(&norm, job.norms + 4 * b, sizeof(norm));
      const float scale = job.alpha * norm / static_cast<float>(job.levels);
      for (; i < stop; ++i) {
        const uint8_t code = codes[i - c0];
        const float value = static_cast<float>(code & kLevel) * scale;
        job.acc[i] += (code & kSign) ? -value : value;
      }
    }
  }
}

// Calls fn(std::integral_constant<int, B>) for the runtime width B = `bits`
// (2..8), so that shifts and masks are compile-time constants.
template <typename Fn>
auto WithBits(int bits, Fn&& fn) {
  switch (bits) {
    case 2:
      return fn(std::integral_constant<int, 2>());
    case 3:
      return fn(std::integral_constant<int, 3>());
    case 4:
      return fn(std::integral_constant<int, 4>());
    case 5:
      return fn(std::integral_constant<int, 5>());
    case 6:
      return fn(std::integral_constant<int, 6>());
    case 7:
      return fn(std::integral_constant<int, 7>());
    default:
      return fn(std::integral_constant<int, 8>());
  }
}

ParallelOptions PartsFor(size_t bucket) {
  // Parts start on a bucket and on a byte of codes.
  return ParallelOptions{/*min_per_part=*/size_t{1} << 20,
                         /*align=*/bucket * 8};
}

absl::Status CheckOptions(const QsgdOptions& o) {
  GC_RETURN_IF_ERROR(CheckRange("qsgd", "bucket", o.bucket, 1, kMaxBucket));
  return CheckRange("qsgd", "bits", o.bits, kMinBits, kMaxBits);
}

}  // namespace

CodecInfo QsgdInfo() {
  CodecInfo info;
  info.name = "qsgd";
  info.id = CodecId::kQsgd;
  info.family = "quantization";
  info.summable = false;
  info.unbiased = true;
  info.stateful = false;
  info.rounds = 1;
  info.shardable = true;
  info.params = {"bits", "bucket"};
  return info;
}

absl::StatusOr<std::unique_ptr<QsgdCodec>> QsgdCodec::Create(
    const CodecParams& params) {
  QsgdOptions o;
  GC_ASSIGN_OR_RETURN(o.bucket, params.GetInt("bucket", o.bucket));
  GC_ASSIGN_OR_RETURN(const int64_t bits, params.GetInt("bits", o.bits));
  GC_RETURN_IF_ERROR(params.CheckAllUsed("qsgd"));
  // Checked before the narrowing below; CheckOptions sees the int.
  GC_RETURN_IF_ERROR(CheckRange("qsgd", "bits", bits, kMinBits, kMaxBits));
  o.bits = static_cast<int>(bits);
  GC_RETURN_IF_ERROR(CheckOptions(o));
  return std::make_unique<QsgdCodec>(o);
}

QsgdCodec::QsgdCodec(const QsgdOptions& options)
    : options_(options), info_(QsgdInfo()) {}

absl::Status QsgdCodec::Encode(const TensorView& grad, TensorState& /*state*/,
                               const StepContext& ctx, Bytes* payload) const {
  const size_t n = grad.numel();
  const size_t bucket = static_cast<size_t>(options_.bucket);
  const int bits = options_.bits;
  const Layout layout = LayoutOf(n, bucket, bits);

  char params[kParamBytes] = {};
  const uint32_t bucket32 = static_cast<uint32_t>(bucket);
  std::memcpy(params, &bucket32, sizeof(bucket32));
  params[4] = static_cast<char>(bits);
  WireHeader header;
  header.codec = CodecId::kQsgd;
  header.numel = n;
  char* body = BeginPayload(header, absl::string_view(params, kParamBytes),
                            layout.body_bytes, payload);

  const PhiloxStream rng = WorkerStream(ctx, /*round=*/0);
  const EncodeJob job{grad.values.data(),
                      bucket,
                      options_.levels(),
                      &rng,
                      body,
                      reinterpret_cast<uint8_t*>(body) + 4 * layout.buckets};
  const ParallelOptions parts = PartsFor(bucket);
  std::vector<char> finite(ParallelParts(n, parts), 1);
  WithBits(bits, [&](auto b) {
    ParallelFor(n, parts, [&](size_t begin, size_t end, int part) {
      finite[part] = EncodeRange<decltype(b)::value>(job, begin, end);
    });
  });
  if (std::find(finite.begin(), finite.end(), 0) != finite.end()) {
    return absl::InvalidArgumentError(kQsgdNonFiniteNorm);
  }
  return absl::OkStatus();
}

absl::StatusOr<QsgdPayload> ParseQsgdPayload(absl::string_view payload,
                                             size_t n) {
  GC_ASSIGN_OR_RETURN(const ParsedPayload parsed,
                      ParsePayload(payload, CodecId::kQsgd, /*round=*/0, n));
  if (parsed.header.flags != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "qsgd: expected header flags 0 (not a dense body), got 0x%02x",
        parsed.header.flags));
  }
  if (parsed.params.size() != kParamBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("qsgd: expected %d parameter bytes, got %d",
                        kParamBytes, parsed.params.size()));
  }
  uint32_t bucket32;
  std::memcpy(&bucket32, parsed.params.data(), sizeof(bucket32));
  QsgdOptions o;
  o.bucket = bucket32;
  o.bits = static_cast<uint8_t>(parsed.params[4]);
  GC_RETURN_IF_ERROR(CheckOptions(o));
  if (parsed.params[5] != 0 || parsed.params[6] != 0 || parsed.params[7] != 0) {
    return absl::InvalidArgumentError(
        "qsgd: expected parameter bytes 5..7 to be zero");
  }
  const size_t bucket = bucket32;
  const Layout layout = LayoutOf(n, bucket, o.bits);
  if (parsed.body.size() != layout.body_bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "qsgd: %d elements in buckets of %d at %d bits need a body of %d "
        "bytes, got %d",
        n, bucket, o.bits, layout.body_bytes, parsed.body.size()));
  }
  const char* norms = parsed.body.data();
  for (uint64_t b = 0; b < layout.buckets; ++b) {
    float norm;
    std::memcpy(&norm, norms + 4 * b, sizeof(norm));
    if (!(norm >= 0) || !std::isfinite(norm)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "qsgd: bucket %d has norm %g; expected a finite value >= 0", b,
          norm));
    }
  }
  const uint8_t* codes =
      reinterpret_cast<const uint8_t*>(norms) + 4 * layout.buckets;
  const int tail_bits = static_cast<int>((n * o.bits) % 8);
  if (tail_bits != 0 && (codes[layout.code_bytes - 1] >> tail_bits) != 0) {
    return absl::InvalidArgumentError(
        "qsgd: expected the padding bits of the last code byte to be zero");
  }
  return QsgdPayload{bucket, o.bits, layout.buckets, layout.code_bytes,
                     parsed.body};
}

namespace {

// acc += alpha * the values of a parsed payload of acc.size() elements.
void AddParsed(const QsgdPayload& parsed, float alpha, absl::Span<float> acc) {
  const size_t bucket = parsed.bucket;
  const QsgdOptions o{static_cast<int64_t>(bucket), parsed.bits};
  const char* norms = parsed.body.data();
  const uint8_t* codes =
      reinterpret_cast<const uint8_t*>(norms) + 4 * parsed.buckets;
  const DecodeJob job{norms, codes, bucket, o.levels(), alpha, acc.data()};
  WithBits(o.bits, [&](auto b) {
    ParallelFor(acc.size(), PartsFor(bucket),
                [&](size_t begin, size_t end, int) {
                  DecodeRange<decltype(b)::value>(job, begin, end);
                });
  });
}

}  // namespace

absl::Status QsgdCodec::DecodeAdd(absl::string_view payload, float alpha,
                                  absl::Span<float> acc) const {
  GC_ASSIGN_OR_RETURN(const QsgdPayload parsed,
                      ParseQsgdPayload(payload, acc.size()));
  AddParsed(parsed, alpha, acc);
  return absl::OkStatus();
}

absl::Status QsgdCodec::FinishGather(absl::Span<const Bytes> payloads,
                                     const StepContext& /*ctx*/,
                                     absl::Span<float> out) const {
  return ParseAllThenAverage(payloads, out, ParseQsgdPayload, AddParsed);
}

absl::Status RegisterQsgd(CodecRegistry& registry) {
  return registry.Register(
      QsgdInfo(),
      [](const CodecParams& params) -> absl::StatusOr<std::unique_ptr<Codec>> {
        GC_ASSIGN_OR_RETURN(std::unique_ptr<QsgdCodec> codec,
                            QsgdCodec::Create(params));
        return std::unique_ptr<Codec>(std::move(codec));
      });
}

}  // namespace gradcomp::codecs
