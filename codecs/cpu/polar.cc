#include "codecs/cpu/polar.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "codecs/cpu/kernels.h"
#include "codecs/cpu/parallel.h"
#include "codecs/cpu/polar_code.h"
#include "codecs/error_feedback.h"
#include "codecs/random.h"
#include "codecs/wire.h"

namespace gradcomp::codecs {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the payload is written with host-order memcpy");

constexpr int kFullRate = 16;  // rate codes are sixteenths
constexpr int kSeedRate = 8;
constexpr int kSeedBits = 16;
constexpr double kSeedScale = 1e5;
constexpr size_t kFixedParamBytes = 8;
constexpr size_t kPlaneParamBytes = 12;
constexpr int64_t kMaxBucket = int64_t{1} << 20;
constexpr int kMinLog2Block = 4;

// Hamming distortion of PolarCode at N = 2048, 4 draws, for rate r / 16,
// r = 0..16, from //codecs/cpu:polar_rate_distortion_tool.
constexpr double kDistortion[kFullRate + 1] = {
    0.5,    0.3653, 0.3079, 0.2641, 0.2277, 0.1965, 0.1687, 0.1440, 0.1216,
    0.1017, 0.0835, 0.0670, 0.0519, 0.0380, 0.0249, 0.0126, 0.0};

// Expected squared error of one bit of a plane sent at rate code r, in units
// of the plane's weight 4^p: 0 raw; 1/4 unsent (reconstructed at its mean);
// D(1 - D) polar-coded (reconstructed at the mean given the decoded bit).
double BitError(int r) {
  if (r == kFullRate) return 0.0;
  if (r == 0) return 0.25;
  return kDistortion[r] * (1 - kDistortion[r]);
}

// Element loops: threads for tensors of a million values and more.
constexpr ParallelOptions kElementParts = {/*min_per_part=*/size_t{1} << 20,
                                           /*align=*/8};

// Appends `count` bits, bit_of(i) for i < count, LSB first, zero-padded to a
// whole byte: each section of the body starts on a byte.
template <typename BitOf>
void AppendBits(uint64_t count, Bytes* body, const BitOf& bit_of) {
  const size_t at = body->size();
  body->resize(at + (count + 7) / 8, '\0');
  uint8_t* out = reinterpret_cast<uint8_t*>(body->data() + at);
  // Parts start on multiples of 8 bits, so each writes its own bytes.
  ParallelFor(count, kElementParts, [&](size_t begin, size_t end, int) {
    for (size_t i = begin; i < end; i += 8) {
      const size_t stop = std::min(end, i + 8);
      uint8_t byte = 0;
      for (size_t t = i; t < stop; ++t) {
        byte = static_cast<uint8_t>(byte | (bit_of(t) << (t - i)));
      }
      out[i / 8] = byte;
    }
  });
}

uint8_t BitAt(const uint8_t* bytes, uint64_t i) {
  return (bytes[i / 8] >> (i % 8)) & 1;
}

// A tensor's bit stream of `bits` bits cut into polar blocks: full blocks of
// 2^log2_block, then a tail block of the next power of two (zero-padded).
struct Block {
  uint64_t start;
  uint64_t length;  // source bits in the block
  int log2_size;
};

std::vector<Block> Blocks(uint64_t bits, int log2_block) {
  std::vector<Block> blocks;
  const uint64_t full = uint64_t{1} << log2_block;
  uint64_t start = 0;
  for (; start + full <= bits; start += full) {
    blocks.push_back({start, full, log2_block});
  }
  if (start < bits) {
    int log2_size = 0;
    while ((uint64_t{1} << log2_size) < bits - start) ++log2_size;
    blocks.push_back({start, bits - start, log2_size});
  }
  return blocks;
}

// Information bits of a bit stream coded at rate code r.
uint64_t CodedBits(uint64_t bits, int r, int log2_block) {
  if (r == 0) return 0;
  if (r == kFullRate) return bits;
  uint64_t total = 0;
  for (const Block& b : Blocks(bits, log2_block)) {
    total += static_cast<uint64_t>(std::lround(r / 16.0 * (1 << b.log2_size)));
  }
  return total;
}

// The codes of a bit stream's blocks at rate code r in (0, 16): one for the
// full blocks, one for a shorter tail block; and where each block's
// information bits start in the stream's information bits.
class BlockCodes {
 public:
  BlockCodes(const std::vector<Block>& blocks, int r, int log2_block)
      : full_(*PolarCode::Create(log2_block, r / 16.0)),
        tail_(blocks.empty() || blocks.back().log2_size == log2_block
                  ? full_
                  : *PolarCode::Create(blocks.back().log2_size, r / 16.0)),
        log2_block_(log2_block),
        info_start_(blocks.size() + 1, 0) {
    for (size_t b = 0; b < blocks.size(); ++b) {
      info_start_[b + 1] = info_start_[b] + code(blocks[b]).k();
    }
  }
  const PolarCode& code(const Block& b) const {
    return b.log2_size == log2_block_ ? full_ : tail_;
  }
  uint64_t info_start(size_t block) const { return info_start_[block]; }

 private:
  PolarCode full_;
  PolarCode tail_;
  int log2_block_;
  std::vector<uint64_t> info_start_;
};

// Blocks per thread: at least 2^13 source bits, a few milliseconds of SC
// encoding, against tens of microseconds to start a thread. Every block's
// uniforms and bits depend on the block alone, so the bytes do not depend
// on the number of threads.
ParallelOptions BlockParts(int log2_block) {
  return {/*min_per_part=*/std::max<size_t>(1, size_t{1 << 13} >> log2_block),
          /*align=*/1};
}

// Polar-codes `source` (source.size() bits) at rate code r in (0, 16):
// appends the information bits to `body` and returns the decoder's view.
std::vector<uint8_t> CodeStream(const std::vector<uint8_t>& source, int r,
                                int log2_block, int draws,
                                const PhiloxStream& rng, uint64_t stream,
                                Bytes* body) {
  std::vector<uint8_t> approx(source.size());
  const std::vector<Block> blocks = Blocks(source.size(), log2_block);
  const BlockCodes codes(blocks, r, log2_block);
  std::vector<uint8_t> info(codes.info_start(blocks.size()));
  ParallelFor(
      blocks.size(), BlockParts(log2_block),
      [&](size_t first, size_t last, int) {
        const size_t max_size = size_t{1} << log2_block;
        std::vector<uint8_t> block(max_size), out(max_size);
        std::vector<float> uniforms(static_cast<size_t>(draws) * max_size);
        for (size_t i = first; i < last; ++i) {
          const Block& b = blocks[i];
          const PolarCode& code = codes.code(b);
          const size_t size = size_t{1} << b.log2_size;
          std::fill_n(block.begin(), size, 0);
          std::copy_n(source.begin() + b.start, b.length, block.begin());
          const absl::Span<float> block_uniforms = absl::MakeSpan(
              uniforms.data(), static_cast<size_t>(draws) * size);
          rng.FillUniform(stream + b.start * draws, block_uniforms);
          code.Encode(
              absl::MakeConstSpan(block.data(), size), block_uniforms,
              absl::MakeSpan(info.data() + codes.info_start(i), code.k()),
              absl::MakeSpan(out.data(), size));
          std::copy_n(out.begin(), b.length, approx.begin() + b.start);
        }
      });
  AppendBits(info.size(), body, [&](size_t i) { return info[i]; });
  return approx;
}

// The inverse of CodeStream: `bits` bits from the information bits at
// `info` (already checked to hold CodedBits(bits, r, log2_block)).
std::vector<uint8_t> DecodeStream(const uint8_t* info, uint64_t bits, int r,
                                  int log2_block) {
  std::vector<uint8_t> out(bits);
  if (r == kFullRate) {
    ParallelFor(bits, kElementParts, [&](size_t begin, size_t end, int) {
      for (size_t i = begin; i < end; ++i) out[i] = BitAt(info, i);
    });
    return out;
  }
  if (r == 0) return out;
  const std::vector<Block> blocks = Blocks(bits, log2_block);
  const BlockCodes codes(blocks, r, log2_block);
  ParallelFor(blocks.size(), BlockParts(log2_block),
              [&](size_t first, size_t last, int) {
                std::vector<uint8_t> block_info, block;
                for (size_t i = first; i < last; ++i) {
                  const Block& b = blocks[i];
                  const PolarCode& code = codes.code(b);
                  block_info.resize(code.k());
                  block.resize(size_t{1} << b.log2_size);
                  uint64_t at = codes.info_start(i);
                  for (uint8_t& bit : block_info) bit = BitAt(info, at++);
                  code.Decode(block_info, absl::MakeSpan(block));
                  std::copy_n(block.begin(), b.length, out.begin() + b.start);
                }
              });
  return out;
}

// Occurrences of (decoded bit a, true bit b) at index 2a + b over i < n,
// for the bits returned by approx_of(i) and true_of(i).
template <typename ApproxOf, typename TrueOf>
std::array<uint64_t, 4> CountPairs(size_t n, const ApproxOf& approx_of,
                                   const TrueOf& true_of) {
  std::vector<std::array<uint64_t, 4>> parts(ParallelParts(n, kElementParts),
                                             std::array<uint64_t, 4>{});
  ParallelFor(n, kElementParts, [&](size_t begin, size_t end, int part) {
    std::array<uint64_t, 4> count = {};
    for (size_t i = begin; i < end; ++i) {
      ++count[2 * approx_of(i) + true_of(i)];
    }
    parts[part] = count;
  });
  std::array<uint64_t, 4> total = {};
  for (const auto& count : parts) {
    for (int j = 0; j < 4; ++j) total[j] += count[j];
  }
  return total;
}

// All of `values` finite, checked on all cores.
bool AllFiniteOnAllCores(absl::Span<const float> values) {
  std::vector<char> finite(ParallelParts(values.size(), kElementParts), 1);
  ParallelFor(values.size(), kElementParts,
              [&](size_t begin, size_t end, int part) {
                finite[part] = AllFinite(values.subspan(begin, end - begin));
              });
  return std::all_of(finite.begin(), finite.end(), [](char c) { return c; });
}

absl::Status CheckPadding(const uint8_t* section, uint64_t bits,
                          absl::string_view what) {
  if (bits % 8 != 0 && (section[bits / 8] >> (bits % 8)) != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "polar: expected the padding bits after the %s to be zero", what));
  }
  return absl::OkStatus();
}

absl::Status CheckOptions(const PolarOptions& o) {
  if (o.magnitude_bits < 1 || o.magnitude_bits > 15) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "polar: magnitude_bits must be in [1, 15]; got %d", o.magnitude_bits));
  }
  if (!(o.bits_per_value >= 1 && o.bits_per_value <= 1 + o.magnitude_bits)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "polar: bits_per_value must be in [1, 1 + magnitude_bits = %d]; got %g",
        1 + o.magnitude_bits, o.bits_per_value));
  }
  if (o.bucket < 1 || o.bucket > kMaxBucket) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "polar: bucket must be in [1, %d]; got %d", kMaxBucket, o.bucket));
  }
  if (o.log2_block < kMinLog2Block || o.log2_block > PolarCode::kMaxLog2N) {
    return absl::InvalidArgumentError(
        absl::StrFormat("polar: log2_block must be in [%d, %d]; got %d",
                        kMinLog2Block, PolarCode::kMaxLog2N, o.log2_block));
  }
  if (o.draws < 1 || o.draws > 16) {
    return absl::InvalidArgumentError(
        absl::StrFormat("polar: draws must be in [1, 16]; got %d", o.draws));
  }
  return absl::OkStatus();
}

// The Philox stream index of plane p's bit i, draw a: planes never overlap.
uint64_t StreamBase(int plane) { return static_cast<uint64_t>(plane) << 48; }

absl::Status EncodeSeed(const TensorView& grad, const PolarOptions& o,
                        const PhiloxStream& rng, Bytes* params, Bytes* body) {
  std::vector<uint8_t> bits(grad.numel() * kSeedBits);
  ParallelFor(grad.numel(), kElementParts, [&](size_t begin, size_t end, int) {
    for (size_t i = begin; i < end; ++i) {
      // fmod keeps the multiple of 2^16 that the int16 cast would drop, with
      // no out-of-range conversion.
      const double t =
          std::fmod(std::trunc(grad.values[i] * kSeedScale), 65536.0);
      const uint16_t word = static_cast<uint16_t>(static_cast<int32_t>(t));
      for (int b = 0; b < kSeedBits; ++b) {
        bits[i * kSeedBits + b] = (word >> b) & 1;
      }
    }
  });
  params->assign(kFixedParamBytes, '\0');
  (*params)[0] = static_cast<char>(PolarMode::kSeed);
  (*params)[1] = static_cast<char>(o.log2_block);
  (*params)[2] = static_cast<char>(kSeedBits);
  CodeStream(bits, kSeedRate, o.log2_block, o.draws, rng, StreamBase(0), body);
  return absl::OkStatus();
}

// Sends magnitude plane p of `level` at rate code r (appending its bits to
// `body`) and returns the plane's reconstruction values for a decoded 0 and
// 1: the mean true bit where the decoder sees 0 and 1; a side never seen
// keeps the bit's own value.
std::array<float, 2> EncodePlane(const std::vector<uint16_t>& level, int p,
                                 int r, const PolarOptions& o,
                                 const PhiloxStream& rng, Bytes* body) {
  const size_t n = level.size();
  const auto true_bit = [&](size_t i) { return (level[i] >> p) & 1; };
  std::array<uint64_t, 4> count = {};
  if (r == kFullRate) {
    AppendBits(n, body, true_bit);
    return {0.0f, 1.0f};
  }
  if (r == 0) {
    count = CountPairs(
        n, [](size_t) { return 0; }, true_bit);
  } else {
    std::vector<uint8_t> bits(n);
    ParallelFor(n, kElementParts, [&](size_t begin, size_t end, int) {
      for (size_t i = begin; i < end; ++i) bits[i] = true_bit(i);
    });
    const std::vector<uint8_t> approx =
        CodeStream(bits, r, o.log2_block, o.draws, rng, StreamBase(p), body);
    count = CountPairs(
        n, [&](size_t i) { return approx[i]; },
        [&](size_t i) { return bits[i]; });
  }
  const double seen0 = static_cast<double>(count[0] + count[1]);
  const double seen1 = static_cast<double>(count[2] + count[3]);
  return {seen0 > 0 ? static_cast<float>(count[1] / seen0) : 0.0f,
          seen1 > 0 ? static_cast<float>(count[3] / seen1) : 1.0f};
}

absl::Status EncodePlanes(const TensorView& grad, const PolarOptions& o,
                          const PhiloxStream& rng, Bytes* params, Bytes* body) {
  const size_t n = grad.numel();
  const size_t bucket = static_cast<size_t>(o.bucket);
  const int planes = o.magnitude_bits;
  const float levels = static_cast<float>((1 << planes) - 1);
  const size_t buckets = (n + bucket - 1) / bucket;
  body->resize(4 * buckets);
  std::vector<uint16_t> level(n);
  // Parts of whole buckets; Encode has checked that the values are finite.
  ParallelFor(
      buckets, {std::max<size_t>(1, kElementParts.min_per_part / bucket), 1},
      [&](size_t first, size_t last, int) {
        for (size_t b = first; b < last; ++b) {
          const size_t end = std::min(n, (b + 1) * bucket);
          float scale = 0;
          for (size_t i = b * bucket; i < end; ++i) {
            scale = std::max(scale, std::fabs(grad.values[i]));
          }
          std::memcpy(body->data() + 4 * b, &scale, sizeof(scale));
          for (size_t i = b * bucket; i < end; ++i) {
            // |g| <= scale, so the level is at most 2^B - 1: no
            // wrap-around.
            level[i] = scale > 0
                           ? static_cast<uint16_t>(std::lround(
                                 std::fabs(grad.values[i]) / scale * levels))
                           : 0;
          }
        }
      });
  AppendBits(n, body,
             [&](size_t i) { return std::signbit(grad.values[i]) ? 1 : 0; });
  const std::vector<int> rates = PolarAllocation(planes, o.bits_per_value - 1);
  params->assign(kFixedParamBytes + kPlaneParamBytes * planes, '\0');
  (*params)[0] = static_cast<char>(PolarMode::kPlanes);
  (*params)[1] = static_cast<char>(o.log2_block);
  (*params)[2] = static_cast<char>(planes);
  const uint32_t bucket32 = static_cast<uint32_t>(bucket);
  std::memcpy(params->data() + 4, &bucket32, sizeof(bucket32));
  for (int p = planes - 1; p >= 0; --p) {
    const int r = rates[p];
    const std::array<float, 2> rec = EncodePlane(level, p, r, o, rng, body);
    char* entry =
        params->data() + kFixedParamBytes + kPlaneParamBytes * (planes - 1 - p);
    entry[0] = static_cast<char>(r);
    std::memcpy(entry + 4, &rec[0], 4);
    std::memcpy(entry + 8, &rec[1], 4);
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<int> PolarAllocation(int magnitude_bits, double plane_bits) {
  std::vector<int> rates(magnitude_bits, 0);
  int spent = 0;  // sixteenths of a bit per value
  const int budget =
      static_cast<int>(std::floor(plane_bits * kFullRate + 1e-9));
  while (true) {
    // The upgrade of one plane with the largest MSE drop per bit that fits;
    // looking past the next rate code takes the convex hull of D(R).
    int best_plane = -1, best_rate = 0;
    double best_gain = 0;
    for (int p = 0; p < magnitude_bits; ++p) {
      const double weight = std::ldexp(1.0, 2 * p);
      for (int r = rates[p] + 1; r <= kFullRate; ++r) {
        if (spent + r - rates[p] > budget) break;
        const double gain =
            weight * (BitError(rates[p]) - BitError(r)) / (r - rates[p]);
        if (gain > best_gain) {
          best_gain = gain;
          best_plane = p;
          best_rate = r;
        }
      }
    }
    if (best_plane < 0) return rates;
    spent += best_rate - rates[best_plane];
    rates[best_plane] = best_rate;
  }
}

CodecInfo PolarInfo() {
  CodecInfo info;
  info.name = "polar";
  info.id = CodecId::kPolar;
  info.family = "quantization";
  info.summable = false;
  // Nearest-level quantisation and lossy plane coding: E[D(C(g))] != g.
  info.unbiased = false;
  info.stateful = false;
  info.shardable = true;
  info.rounds = 1;
  info.params = {"bits_per_value", "bucket",         "draws", "error_feedback",
                 "log2_block",     "magnitude_bits", "mode"};
  return info;
}

absl::StatusOr<std::unique_ptr<PolarCodec>> PolarCodec::Create(
    const CodecParams& params) {
  PolarOptions o;
  GC_ASSIGN_OR_RETURN(const std::string mode,
                      params.GetString("mode", "planes"));
  GC_ASSIGN_OR_RETURN(o.bits_per_value,
                      params.GetDouble("bits_per_value", o.bits_per_value));
  GC_ASSIGN_OR_RETURN(o.bucket, params.GetInt("bucket", o.bucket));
  GC_ASSIGN_OR_RETURN(const int64_t magnitude_bits,
                      params.GetInt("magnitude_bits", o.magnitude_bits));
  GC_ASSIGN_OR_RETURN(const int64_t log2_block,
                      params.GetInt("log2_block", o.log2_block));
  GC_ASSIGN_OR_RETURN(const int64_t draws, params.GetInt("draws", o.draws));
  GC_RETURN_IF_ERROR(params.CheckAllUsed("polar"));
  if (mode == "planes") {
    o.mode = PolarMode::kPlanes;
  } else if (mode == "seed") {
    o.mode = PolarMode::kSeed;
  } else {
    return absl::InvalidArgumentError(absl::StrFormat(
        "polar: mode must be 'planes' or 'seed'; got '%s'", mode));
  }
  // CheckOptions names each range and the value given; a value beyond int
  // (which a cast would truncate) is beyond every range, and named here.
  const auto narrow = [](const char* name, int64_t v) -> absl::StatusOr<int> {
    if (v < std::numeric_limits<int>::min() ||
        v > std::numeric_limits<int>::max()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("polar: %s is %d, far outside its range", name, v));
    }
    return static_cast<int>(v);
  };
  GC_ASSIGN_OR_RETURN(o.magnitude_bits,
                      narrow("magnitude_bits", magnitude_bits));
  GC_ASSIGN_OR_RETURN(o.log2_block, narrow("log2_block", log2_block));
  GC_ASSIGN_OR_RETURN(o.draws, narrow("draws", draws));
  GC_RETURN_IF_ERROR(CheckOptions(o));
  return std::make_unique<PolarCodec>(o);
}

PolarCodec::PolarCodec(const PolarOptions& options)
    : options_(options), info_(PolarInfo()) {}

absl::Status PolarCodec::Encode(const TensorView& grad, TensorState& /*state*/,
                                const StepContext& ctx, Bytes* payload) const {
  if (!AllFiniteOnAllCores(grad.values)) {
    return absl::InvalidArgumentError(
        "polar: the gradient holds NaN or Inf; expected finite values");
  }
  const PhiloxStream rng = WorkerStream(ctx, /*round=*/0);
  Bytes params, body;
  if (options_.mode == PolarMode::kSeed) {
    GC_RETURN_IF_ERROR(EncodeSeed(grad, options_, rng, &params, &body));
  } else {
    GC_RETURN_IF_ERROR(EncodePlanes(grad, options_, rng, &params, &body));
  }
  WireHeader header;
  header.codec = CodecId::kPolar;
  header.numel = grad.numel();
  payload->clear();
  WritePayload(header, params, body, payload);
  return absl::OkStatus();
}

absl::Status PolarCodec::DecodeAdd(absl::string_view payload, float alpha,
                                   absl::Span<float> acc) const {
  const size_t n = acc.size();
  GC_ASSIGN_OR_RETURN(const ParsedPayload parsed,
                      ParsePayload(payload, CodecId::kPolar, /*round=*/0, n));
  if (parsed.header.flags != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "polar: expected header flags 0 (not a dense body), got 0x%02x",
        parsed.header.flags));
  }
  const absl::string_view params = parsed.params;
  if (params.size() < kFixedParamBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("polar: expected at least %d parameter bytes, got %d",
                        kFixedParamBytes, params.size()));
  }
  PolarOptions o;
  const uint8_t mode = static_cast<uint8_t>(params[0]);
  o.log2_block = static_cast<uint8_t>(params[1]);
  const int planes = static_cast<uint8_t>(params[2]);
  uint32_t bucket32;
  std::memcpy(&bucket32, params.data() + 4, sizeof(bucket32));
  if (params[3] != 0) {
    return absl::InvalidArgumentError(
        "polar: expected parameter byte 3 to be zero");
  }
  const uint8_t* body = reinterpret_cast<const uint8_t*>(parsed.body.data());
  const uint64_t body_bytes = parsed.body.size();

  if (mode == static_cast<uint8_t>(PolarMode::kSeed)) {
    if (planes != kSeedBits || bucket32 != 0 ||
        params.size() != kFixedParamBytes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "polar seed mode: expected 16 bits, bucket 0 and %d parameter "
          "bytes; got %d, %d and %d",
          kFixedParamBytes, planes, bucket32, params.size()));
    }
    GC_RETURN_IF_ERROR(CheckOptions(o));
    const uint64_t bits = uint64_t{n} * kSeedBits;
    const uint64_t coded = CodedBits(bits, kSeedRate, o.log2_block);
    if (body_bytes != (coded + 7) / 8) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "polar seed mode: %d elements need a body of %d bytes, got %d", n,
          (coded + 7) / 8, body_bytes));
    }
    GC_RETURN_IF_ERROR(CheckPadding(body, coded, "information bits"));
    const std::vector<uint8_t> out =
        DecodeStream(body, bits, kSeedRate, o.log2_block);
    ParallelFor(n, kElementParts, [&](size_t begin, size_t end, int) {
      for (size_t i = begin; i < end; ++i) {
        uint16_t word = 0;
        for (int b = 0; b < kSeedBits; ++b) word |= out[i * kSeedBits + b] << b;
        acc[i] +=
            alpha * static_cast<float>(static_cast<int16_t>(word) / kSeedScale);
      }
    });
    return absl::OkStatus();
  }
  if (mode != static_cast<uint8_t>(PolarMode::kPlanes)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "polar: expected mode 1 (planes) or 2 (seed), got %d", mode));
  }
  o.magnitude_bits = planes;
  o.bucket = bucket32;
  o.bits_per_value = 1;
  GC_RETURN_IF_ERROR(CheckOptions(o));
  if (params.size() != kFixedParamBytes + kPlaneParamBytes * planes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "polar: %d planes need %d parameter bytes, got %d", planes,
        kFixedParamBytes + kPlaneParamBytes * planes, params.size()));
  }
  const size_t bucket = bucket32;
  const uint64_t buckets = (n + bucket - 1) / bucket;
  std::vector<int> rates(planes);
  std::vector<float> rec0(planes), rec1(planes);
  uint64_t expected = 4 * buckets + (n + 7) / 8;
  for (int p = planes - 1; p >= 0; --p) {
    const char* entry =
        params.data() + kFixedParamBytes + kPlaneParamBytes * (planes - 1 - p);
    rates[p] = static_cast<uint8_t>(entry[0]);
    std::memcpy(&rec0[p], entry + 4, 4);
    std::memcpy(&rec1[p], entry + 8, 4);
    const bool valid_rec =
        rec0[p] >= 0 && rec0[p] <= 1 && rec1[p] >= 0 && rec1[p] <= 1;
    if (rates[p] > kFullRate || entry[1] != 0 || entry[2] != 0 ||
        entry[3] != 0 || !valid_rec ||
        (rates[p] == kFullRate && (rec0[p] != 0 || rec1[p] != 1))) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "polar: plane %d: expected a rate code <= 16, zero padding and "
          "reconstruction values in [0, 1] (0 and 1 when raw); got rate %d, "
          "values %g and %g",
          p, rates[p], rec0[p], rec1[p]));
    }
    expected += (CodedBits(n, rates[p], o.log2_block) + 7) / 8;
  }
  if (body_bytes != expected) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "polar: %d elements in buckets of %d with these plane rates need a "
        "body of %d bytes, got %d",
        n, bucket, expected, body_bytes));
  }
  for (uint64_t b = 0; b < buckets; ++b) {
    float scale;
    std::memcpy(&scale, body + 4 * b, sizeof(scale));
    if (!(scale >= 0) || !std::isfinite(scale)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "polar: bucket %d has scale %g; expected a finite value >= 0", b,
          scale));
    }
  }
  const uint8_t* signs = body + 4 * buckets;
  GC_RETURN_IF_ERROR(CheckPadding(signs, n, "sign bits"));
  // Magnitudes in units of one level, accumulated plane by plane.
  std::vector<float> magnitude(n, 0.0f);
  const uint8_t* section = signs + (n + 7) / 8;
  for (int p = planes - 1; p >= 0; --p) {
    const uint64_t coded = CodedBits(n, rates[p], o.log2_block);
    GC_RETURN_IF_ERROR(CheckPadding(section, coded, "plane bits"));
    const std::vector<uint8_t> bits =
        DecodeStream(section, n, rates[p], o.log2_block);
    const float weight = std::ldexp(1.0f, p);
    const float value[2] = {weight * rec0[p], weight * rec1[p]};
    ParallelFor(n, kElementParts, [&](size_t begin, size_t end, int) {
      for (size_t i = begin; i < end; ++i) magnitude[i] += value[bits[i]];
    });
    section += (coded + 7) / 8;
  }
  const float levels = static_cast<float>((1 << planes) - 1);
  ParallelFor(n, kElementParts, [&](size_t begin, size_t end, int) {
    for (size_t i = begin; i < end; ++i) {
      float scale;
      std::memcpy(&scale, body + 4 * (i / bucket), sizeof(scale));
      const float value = alpha * scale / levels * magnitude[i];
      acc[i] += BitAt(signs, i) ? -value : value;
    }
  });
  return absl::OkStatus();
}

absl::Status RegisterPolar(CodecRegistry& registry) {
  return registry.Register(
      PolarInfo(),
      [](const CodecParams& params) -> absl::StatusOr<std::unique_ptr<Codec>> {
        GC_ASSIGN_OR_RETURN(const bool error_feedback,
                            params.GetBool("error_feedback", false));
        GC_ASSIGN_OR_RETURN(std::unique_ptr<PolarCodec> codec,
                            PolarCodec::Create(params));
        if (!error_feedback) return std::unique_ptr<Codec>(std::move(codec));
        if (codec->options().mode == PolarMode::kSeed) {
          return absl::InvalidArgumentError(
              "polar: expected mode=planes with error_feedback=true (seed "
              "mode's int16 wrap-around makes errors larger than the values, "
              "so the residual would grow); got mode=seed");
        }
        return std::unique_ptr<Codec>(
            std::make_unique<ErrorFeedback>(std::move(codec)));
      });
}

}  // namespace gradcomp::codecs
