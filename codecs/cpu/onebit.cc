#include "codecs/cpu/onebit.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
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

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the payload is written with host-order memcpy");

constexpr size_t kParamBytes = 8;
// Below this many columns a row is too short to vectorise over: rows are
// grouped into lanes of at least this width (a multiple of the columns).
constexpr size_t kMinLanes = 64;
// Columns summed at a time by one thread in the wide case.
constexpr size_t kColumnBlock = 1024;
// Elements per partial sum in the narrow case: the sums' order is fixed by
// these chunks, not by the number of threads.
constexpr size_t kNarrowChunk = size_t{1} << 16;

size_t BodyBytes(size_t n, size_t columns) {
  return 8 * columns + SignBytes(n);
}

// The lane width: columns repeated until at least kMinLanes wide.
size_t LaneWidth(size_t columns) {
  return columns >= kMinLanes ? columns
                              : columns * ((kMinLanes + columns - 1) / columns);
}

// Per-lane sums of the non-negative values, of the negative values, and the
// count of negative values.
struct Sums {
  explicit Sums(size_t width)
      : pos(width, 0.0), neg(width, 0.0), negatives(width, 0.0) {}
  std::vector<double> pos, neg, negatives;
};

// Adds rows [r0, r1) of the row-major matrix x (row stride `stride`),
// columns [j0, j0 + width), into sums lanes [0, width) from `lane`.
inline void AccumulateRows(const float* x, size_t stride, size_t r0, size_t r1,
                           size_t j0, size_t width, Sums& sums, size_t lane) {
  double* pos = sums.pos.data() + lane;
  double* neg = sums.neg.data() + lane;
  double* negatives = sums.negatives.data() + lane;
  for (size_t r = r0; r < r1; ++r) {
    const float* row = x + r * stride + j0;
    // Splits v by its bits: a float compare may trap (-ftrapping-math), so
    // GCC keeps it a branch; an integer one becomes a vector mask. Bits
    // above 0x80000000 are the values < 0 (-0 is not), and -NaN, which
    // like +NaN and the infinities makes a sum non-finite and is caught.
    for (size_t j = 0; j < width; ++j) {
      uint32_t bits;
      std::memcpy(&bits, row + j, sizeof(bits));
      const uint32_t negative = bits > 0x80000000u ? ~0u : 0u;
      const uint32_t neg_bits = bits & negative;
      const uint32_t pos_bits = bits & ~negative;
      float neg_part, pos_part;
      std::memcpy(&neg_part, &neg_bits, sizeof(neg_part));
      std::memcpy(&pos_part, &pos_bits, sizeof(pos_part));
      pos[j] += pos_part;
      neg[j] += neg_part;
      negatives[j] += static_cast<double>(negative & 1u);
    }
  }
}

// Per-column sums of x seen as [rows, columns], each column's in a fixed
// order whatever the number of threads.
Sums ColumnSums(absl::Span<const float> x, size_t rows, size_t columns) {
  Sums sums(columns);
  if (columns == 0) return sums;
  if (columns >= kMinLanes) {
    // Wide: threads split the columns; each column is summed in row order.
    const size_t min_columns =
        std::max<size_t>(kColumnBlock, (size_t{1} << 20) / rows);
    ParallelFor(columns, ParallelOptions{min_columns, kColumnBlock},
                [&](size_t begin, size_t end, int) {
                  for (size_t j = begin; j < end; j += kColumnBlock) {
                    const size_t width = std::min(kColumnBlock, end - j);
                    AccumulateRows(x.data(), columns, 0, rows, j, width, sums,
                                   j);
                  }
                });
    return sums;
  }
  // Narrow: x as [n / w, w] with w a multiple of the columns, the last row
  // possibly short; partial sums per chunk of rows, added in chunk order,
  // then lanes folded onto their columns.
  const size_t n = x.size();
  const size_t w = LaneWidth(columns);
  const size_t chunk_rows = std::max<size_t>(1, kNarrowChunk / w);
  const size_t chunk = chunk_rows * w;
  const size_t chunks = (n + chunk - 1) / chunk;
  std::vector<Sums> partial(chunks, Sums(w));
  ParallelFor(n, ParallelOptions{size_t{1} << 20, chunk},
              [&](size_t begin, size_t end, int) {
                for (size_t c0 = begin; c0 < end; c0 += chunk) {
                  const size_t c1 = std::min(c0 + chunk, end);
                  Sums& s = partial[c0 / chunk];
                  const size_t full = (c1 - c0) / w;
                  AccumulateRows(x.data() + c0, w, 0, full, 0, w, s, 0);
                  AccumulateRows(x.data() + c0 + full * w, 0, 0, 1, 0,
                                 c1 - c0 - full * w, s, 0);
                }
              });
  for (const Sums& s : partial) {
    for (size_t lane = 0; lane < w; ++lane) {
      sums.pos[lane % columns] += s.pos[lane];
      sums.neg[lane % columns] += s.neg[lane];
      sums.negatives[lane % columns] += s.negatives[lane];
    }
  }
  return sums;
}

}  // namespace

CodecInfo OneBitInfo() {
  CodecInfo info;
  info.name = "onebit";
  info.id = CodecId::kOneBit;
  info.family = "quantization";
  info.summable = false;
  info.unbiased = false;
  // The residual is the decorator's state.
  info.stateful = true;
  info.rounds = 1;
  return info;
}

absl::StatusOr<std::unique_ptr<SingleRoundCodec>> OneBitCodec::Create(
    const CodecParams& params) {
  GC_RETURN_IF_ERROR(params.CheckAllUsed("onebit"));
  return std::unique_ptr<SingleRoundCodec>(
      std::make_unique<ErrorFeedback>(std::make_unique<OneBitCodec>()));
}

OneBitCodec::OneBitCodec() : info_(OneBitInfo()) {}

absl::StatusOr<size_t> OneBitColumns(size_t n, int64_t rows) {
  if (n == 0) return 0;
  if (rows <= 0 || n % static_cast<uint64_t>(rows) != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "onebit: expected shape[0] to divide the %d elements, got %d", n,
        rows));
  }
  return n / static_cast<size_t>(rows);
}

float OneBitMean(double sum, double count) {
  return count > 0 ? static_cast<float>(sum / count) : 0.0f;
}

char* BeginOneBitPayload(size_t n, size_t columns, Bytes* payload) {
  char params[kParamBytes];
  const uint64_t columns64 = columns;
  std::memcpy(params, &columns64, sizeof(columns64));
  WireHeader header;
  header.codec = CodecId::kOneBit;
  header.numel = n;
  return BeginPayload(header, absl::string_view(params, kParamBytes),
                      BodyBytes(n, columns), payload);
}

absl::Status OneBitCodec::Encode(const TensorView& grad, TensorState& /*state*/,
                                 const StepContext& /*ctx*/,
                                 Bytes* payload) const {
  const size_t n = grad.numel();
  const int64_t rows = grad.rows();
  GC_ASSIGN_OR_RETURN(const size_t columns, OneBitColumns(n, rows));
  char* body = BeginOneBitPayload(n, columns, payload);
  const Sums sums = ColumnSums(grad.values, n == 0 ? 0 : rows, columns);
  bool finite = true;
  for (size_t j = 0; j < columns; ++j) {
    const double negatives = sums.negatives[j];
    const float pos =
        OneBitMean(sums.pos[j], static_cast<double>(rows) - negatives);
    const float neg = OneBitMean(sums.neg[j], negatives);
    finite = finite && std::isfinite(pos) && std::isfinite(neg);
    std::memcpy(body + 4 * j, &pos, sizeof(pos));
    std::memcpy(body + 4 * (columns + j), &neg, sizeof(neg));
  }
  if (!finite) {
    return absl::InvalidArgumentError(
        "onebit: the gradient holds NaN or Inf (a column's mean is not "
        "finite); expected finite values");
  }
  PackSigns(grad.values, body + 8 * columns);
  return absl::OkStatus();
}

absl::StatusOr<OneBitPayload> ParseOneBitPayload(absl::string_view payload,
                                                 size_t n) {
  GC_ASSIGN_OR_RETURN(const ParsedPayload parsed,
                      ParsePayload(payload, CodecId::kOneBit, /*round=*/0, n));
  if (parsed.header.flags != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "onebit: expected header flags 0 (not a dense body), got 0x%02x",
        parsed.header.flags));
  }
  if (parsed.params.size() != kParamBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("onebit: expected %d parameter bytes, got %d",
                        kParamBytes, parsed.params.size()));
  }
  uint64_t columns64;
  std::memcpy(&columns64, parsed.params.data(), sizeof(columns64));
  const bool columns_ok =
      n == 0 ? columns64 == 0
             : columns64 >= 1 && columns64 <= n && n % columns64 == 0;
  if (!columns_ok) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "onebit: expected a column count dividing %d (0 for an empty "
        "tensor), got %d",
        n, columns64));
  }
  const size_t columns = static_cast<size_t>(columns64);
  if (parsed.body.size() != BodyBytes(n, columns)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "onebit: %d elements in %d columns need a body of %d bytes, got %d", n,
        columns, BodyBytes(n, columns), parsed.body.size()));
  }
  OneBitPayload out;
  out.columns = columns;
  out.means = parsed.body.substr(0, 8 * columns);
  out.signs = parsed.body.substr(8 * columns);
  for (size_t j = 0; j < columns; ++j) {
    float pos, neg;
    std::memcpy(&pos, out.means.data() + 4 * j, sizeof(pos));
    std::memcpy(&neg, out.means.data() + 4 * (columns + j), sizeof(neg));
    if (!(pos >= 0) || !std::isfinite(pos) || !(neg <= 0) ||
        !std::isfinite(neg)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "onebit: column %d has means %g and %g; expected finite values, "
          ">= 0 and <= 0",
          j, pos, neg));
    }
  }
  if (n > 0 && !SignPaddingIsZero(out.signs.data(), n)) {
    return absl::InvalidArgumentError(
        "onebit: expected the padding bits after the signs to be zero");
  }
  return out;
}

absl::Status OneBitCodec::DecodeAdd(absl::string_view payload, float alpha,
                                    absl::Span<float> acc) const {
  const size_t n = acc.size();
  GC_ASSIGN_OR_RETURN(const OneBitPayload p, ParseOneBitPayload(payload, n));
  if (n == 0) return absl::OkStatus();
  const size_t columns = p.columns;
  // Means, scaled by alpha, repeated for AddSignsPeriodic.
  std::vector<float> pos(columns + 64), neg(columns + 64);
  std::memcpy(pos.data(), p.means.data(), 4 * columns);
  std::memcpy(neg.data(), p.means.data() + 4 * columns, 4 * columns);
  for (size_t j = 0; j < columns; ++j) {
    pos[j] *= alpha;
    neg[j] *= alpha;
  }
  for (size_t lane = columns; lane < pos.size(); ++lane) {
    pos[lane] = pos[lane - columns];
    neg[lane] = neg[lane - columns];
  }
  AddSignsPeriodic(p.signs.data(), pos, neg, acc);
  return absl::OkStatus();
}

absl::Status RegisterOneBit(CodecRegistry& registry) {
  return registry.Register(
      OneBitInfo(),
      [](const CodecParams& params) -> absl::StatusOr<std::unique_ptr<Codec>> {
        GC_ASSIGN_OR_RETURN(std::unique_ptr<SingleRoundCodec> codec,
                            OneBitCodec::Create(params));
        return std::unique_ptr<Codec>(std::move(codec));
      });
}

}  // namespace gradcomp::codecs
