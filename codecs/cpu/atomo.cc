#include "codecs/cpu/atomo.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <utility>
#include <vector>

#include "Eigen/Dense"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "codecs/cpu/index_coding.h"
#include "codecs/cpu/kernels.h"
#include "codecs/random.h"
#include "codecs/wire.h"

namespace gradcomp::codecs {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the payload is written with host-order memcpy");

constexpr size_t kParamBytes = 16;
constexpr size_t kChunk = 4096;
// The largest |v_i[c]| a spectral payload may hold. v_i is a column of the
// SVD's V, a unit vector, so each entry is at most 1 up to the SVD's
// rounding (at most about 1.2e-6 over many shapes and inputs); the bound
// leaves 800 times that. The magnitude travels in u_i sigma_i / p_i: with v
// bounded, a term of the decode is no larger than the u value it comes
// from, where two arbitrary finite values could multiply to Inf.
constexpr float kMaxUnitEntry = 1.0f + 1.0f / 1024;

absl::Status CheckOptions(const AtomoOptions& o) {
  const bool entry = o.atoms == AtomoAtoms::kEntry;
  if (!std::isfinite(o.budget) || o.budget <= 0 || (entry && o.budget > 1)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "atomo: budget must be %s; got %g",
        entry ? "a fraction in (0, 1] for entry atoms"
              : "a finite number of atoms > 0 for spectral atoms",
        o.budget));
  }
  return absl::OkStatus();
}

void WriteParams(AtomoAtoms atoms, uint32_t count, uint64_t rows,
                 char params[kParamBytes]) {
  std::memset(params, 0, kParamBytes);
  params[0] = static_cast<char>(atoms);
  std::memcpy(params + 4, &count, sizeof(count));
  std::memcpy(params + 8, &rows, sizeof(rows));
}

std::vector<float> ReadFloats(const char* data, size_t count) {
  std::vector<float> out(count);
  if (count > 0) std::memcpy(out.data(), data, count * sizeof(float));
  return out;
}

// A finite gradient whose atoms, divided by their probability, leave float
// range (values near FLT_MAX x the budget).
absl::Status OutOfFloatRange(absl::string_view atoms, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(
      "atomo: a ", atoms, " atom's ", what,
      " divided by its probability leaves float range; expected gradient "
      "values well below 3.4e38 times the budget (or a larger budget)"));
}

// Checks that every atom's v (the cols values after its rows values of u
// sigma / p) has entries of at most kMaxUnitEntry in magnitude, as a unit
// vector's are.
absl::Status CheckUnitVectors(const std::vector<float>& body, uint32_t count,
                              uint64_t rows, uint64_t cols) {
  for (uint32_t k = 0; k < count; ++k) {
    const float* v = body.data() + k * (rows + cols) + rows;
    for (uint64_t c = 0; c < cols; ++c) {
      if (!(std::fabs(v[c]) <= kMaxUnitEntry)) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "atomo: atom %d has v[%d] = %g; expected a unit vector (entries "
            "at most 1 in magnitude)",
            k, c, v[c]));
      }
    }
  }
  return absl::OkStatus();
}

// With unit-sized v, |decode[r][c]| <= |alpha| * kMaxUnitEntry * the sum
// over atoms of |u_k[r]|: a row whose bound passes FLT_MAX could decode to
// Inf from finite atoms, and is refused. The encoder refuses to send one,
// though the atoms' true sum may cancel to a finite row.
absl::Status CheckRowSums(const std::vector<float>& body, uint32_t count,
                          uint64_t rows, uint64_t cols, float alpha) {
  const double scale = std::fabs(double{alpha}) * kMaxUnitEntry;
  for (uint64_t r = 0; r < rows; ++r) {
    double sum = 0;
    for (uint32_t k = 0; k < count; ++k) {
      sum += std::fabs(body[k * (rows + cols) + r]);
    }
    if (sum * scale > std::numeric_limits<float>::max()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "atomo: the atoms' u values of row %d add up to %g; expected a "
          "sum whose decode stays finite",
          r, sum));
    }
  }
  return absl::OkStatus();
}

absl::Status EncodeSpectral(const TensorView& grad, const StepContext& ctx,
                            double budget, Bytes* payload) {
  const size_t n = grad.numel();
  const int64_t rows = n == 0 ? 0 : grad.rows();
  const int64_t cols = n == 0 ? 0 : static_cast<int64_t>(n) / rows;
  std::vector<float> body;
  uint32_t count = 0;
  if (n > 0) {
    using RowMatrix =
        Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    const Eigen::Map<const RowMatrix> m(grad.values.data(), rows, cols);
    const Eigen::BDCSVD<Eigen::MatrixXf> svd(
        m, Eigen::ComputeThinU | Eigen::ComputeThinV);
    const Eigen::VectorXf& sigma = svd.singularValues();
    const AtomoProbabilities probs = ComputeAtomoProbabilities(
        absl::MakeConstSpan(sigma.data(), sigma.size()), budget);
    const PhiloxStream rng = WorkerStream(ctx, /*round=*/0);
    for (int64_t i = 0; i < sigma.size(); ++i) {
      const double p = probs.p(sigma[i]);
      if (!(rng.Uniform(i) < p)) continue;
      const float scale = static_cast<float>(sigma[i] / p);
      for (int64_t r = 0; r < rows; ++r)
        body.push_back(svd.matrixU()(r, i) * scale);
      for (int64_t c = 0; c < cols; ++c) body.push_back(svd.matrixV()(c, i));
      ++count;
    }
  }
  // Decoders refuse a value that is not finite, or a row whose atoms could
  // add up past float range; say so here, where it is known why.
  if (!AllFinite(body)) return OutOfFloatRange("spectral", "singular value");
  if (!CheckUnitVectors(body, count, rows, cols).ok() ||
      !CheckRowSums(body, count, rows, cols, 1.0f).ok()) {
    return OutOfFloatRange("spectral", "u values of one row, added up,");
  }
  char params[kParamBytes];
  WriteParams(AtomoAtoms::kSpectral, count, static_cast<uint64_t>(rows),
              params);
  WireHeader header;
  header.codec = CodecId::kAtomo;
  header.numel = n;
  char* out = BeginPayload(header, absl::string_view(params, kParamBytes),
                           body.size() * sizeof(float), payload);
  if (!body.empty()) std::memcpy(out, body.data(), body.size() * sizeof(float));
  return absl::OkStatus();
}

absl::Status EncodeEntry(const TensorView& grad, const StepContext& ctx,
                         double budget, Bytes* payload) {
  const size_t n = grad.numel();
  if (n > uint64_t{0xFFFFFFFF}) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "atomo: entry atoms need fewer than 2^32 elements; got %d", n));
  }
  const AtomoProbabilities probs =
      ComputeAtomoProbabilities(grad.values, budget * static_cast<double>(n));
  const PhiloxStream rng = WorkerStream(ctx, /*round=*/0);
  std::vector<uint32_t> indices;
  std::vector<float> values;
  float uniforms[kChunk];
  for (size_t c0 = 0; c0 < n; c0 += kChunk) {
    const size_t c1 = std::min(n, c0 + kChunk);
    rng.FillUniform(c0, absl::MakeSpan(uniforms, c1 - c0));
    for (size_t i = c0; i < c1; ++i) {
      const double p = probs.p(grad.values[i]);
      if (uniforms[i - c0] < p) {
        indices.push_back(static_cast<uint32_t>(i));
        values.push_back(static_cast<float>(grad.values[i] / p));
      }
    }
  }
  if (!AllFinite(values)) return OutOfFloatRange("entry", "value");
  const IndexPlan plan = PlanIndices(indices);
  char params[kParamBytes];
  WriteParams(AtomoAtoms::kEntry, static_cast<uint32_t>(indices.size()), 0,
              params);
  WireHeader header;
  header.codec = CodecId::kAtomo;
  header.numel = n;
  char* out = BeginPayload(header, absl::string_view(params, kParamBytes),
                           plan.bytes + values.size() * sizeof(float), payload);
  EncodeIndices(indices, plan, out);
  if (!values.empty()) {
    std::memcpy(out + plan.bytes, values.data(), values.size() * sizeof(float));
  }
  return absl::OkStatus();
}

absl::Status DecodeSpectral(const ParsedPayload& parsed, uint32_t count,
                            uint64_t rows, float alpha, absl::Span<float> acc) {
  const uint64_t n = acc.size();
  uint64_t cols = 0;
  if (n == 0) {
    if (rows != 0 || count != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "atomo: an empty tensor has 0 rows and atoms; got %d and %d", rows,
          count));
    }
  } else {
    if (rows == 0 || n % rows != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "atomo: expected a row count dividing %d elements, got %d", n, rows));
    }
    cols = n / rows;
    if (count > std::min(rows, cols)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "atomo: a %d x %d matrix has at most %d spectral atoms; got %d", rows,
          cols, std::min(rows, cols), count));
    }
  }
  // count <= min(rows, cols), so this is at most 2n floats: no overflow.
  const uint64_t floats = count * (rows + cols);
  if (parsed.body.size() != floats * sizeof(float)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "atomo: %d spectral atoms of %d x %d need a body of %d bytes, got %d",
        count, rows, cols, floats * sizeof(float), parsed.body.size()));
  }
  const std::vector<float> body = ReadFloats(parsed.body.data(), floats);
  if (!AllFinite(body)) {
    return absl::InvalidArgumentError(
        "atomo: expected finite atom values, got NaN or Inf");
  }
  GC_RETURN_IF_ERROR(CheckUnitVectors(body, count, rows, cols));
  GC_RETURN_IF_ERROR(CheckRowSums(body, count, rows, cols, alpha));
  for (uint32_t k = 0; k < count; ++k) {
    const float* u = body.data() + k * (rows + cols);
    const float* v = u + rows;
    for (uint64_t r = 0; r < rows; ++r) {
      const float ur = alpha * u[r];
      float* row = acc.data() + r * cols;
      for (uint64_t c = 0; c < cols; ++c) row[c] += ur * v[c];
    }
  }
  return absl::OkStatus();
}

absl::Status DecodeEntry(const ParsedPayload& parsed, uint32_t count,
                         uint64_t rows, float alpha, absl::Span<float> acc) {
  if (rows != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "atomo: expected rows 0 in an entry payload, got %d", rows));
  }
  if (count > acc.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "atomo: expected at most %d entries, got %d", acc.size(), count));
  }
  std::vector<uint32_t> indices;
  GC_ASSIGN_OR_RETURN(const size_t used,
                      DecodeIndices(parsed.body, count, acc.size(), &indices));
  if (parsed.body.size() - used != uint64_t{count} * sizeof(float)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "atomo: expected %d value bytes after the indices, got %d",
        uint64_t{count} * sizeof(float), parsed.body.size() - used));
  }
  const std::vector<float> values =
      ReadFloats(parsed.body.data() + used, count);
  if (!AllFinite(values)) {
    return absl::InvalidArgumentError(
        "atomo: expected finite entry values, got NaN or Inf");
  }
  for (uint32_t k = 0; k < count; ++k) acc[indices[k]] += alpha * values[k];
  return absl::OkStatus();
}

}  // namespace

AtomoProbabilities ComputeAtomoProbabilities(absl::Span<const float> lambda,
                                             double s) {
  AtomoProbabilities probs;
  const size_t n = lambda.size();
  if (n == 0) return probs;
  // The loop below stops by position ceil(s): sort only that far.
  const size_t m =
      std::min(n, static_cast<size_t>(std::min(s, static_cast<double>(n))) + 2);
  std::vector<float> mag(n);
  for (size_t i = 0; i < n; ++i) mag[i] = std::fabs(lambda[i]);
  std::nth_element(mag.begin(), mag.begin() + (m - 1), mag.end(),
                   std::greater<float>());
  std::sort(mag.begin(), mag.begin() + m, std::greater<float>());
  double rest = 0;
  for (size_t i = m; i < n; ++i) rest += mag[i];
  // tail[i] = sum of |lambda| from sorted position i on, for i < m.
  std::vector<double> tail(m + 1);
  tail[m] = rest;
  for (size_t i = m; i-- > 0;) tail[i] = tail[i + 1] + mag[i];
  double left = s;
  for (size_t i = 0; i < m; ++i) {
    if (mag[i] * left <= tail[i]) {
      // Positions < i are kept surely; the rest share what is left of s.
      probs.keep_at =
          i == 0 ? std::numeric_limits<float>::infinity() : mag[i - 1];
      probs.c = tail[i] > 0 ? left / tail[i] : 0.0;
      return probs;
    }
    left -= 1;
  }
  // Every atom is kept (s covers all of them, and none is zero).
  probs.keep_at = mag[m - 1];
  probs.c = 0;
  return probs;
}

CodecInfo AtomoInfo() {
  CodecInfo info;
  info.name = "atomo";
  info.id = CodecId::kAtomo;
  info.family = "sparsification";
  info.summable = false;
  info.unbiased = true;
  info.stateful = false;
  info.rounds = 1;
  info.params = {"atoms", "budget"};
  return info;
}

absl::StatusOr<std::unique_ptr<AtomoCodec>> AtomoCodec::Create(
    const CodecParams& params) {
  AtomoOptions o;
  GC_ASSIGN_OR_RETURN(const std::string atoms,
                      params.GetString("atoms", "spectral"));
  if (atoms == "spectral") {
    o.atoms = AtomoAtoms::kSpectral;
  } else if (atoms == "entry") {
    o.atoms = AtomoAtoms::kEntry;
  } else {
    return absl::InvalidArgumentError(absl::StrFormat(
        "atomo: atoms must be 'spectral' or 'entry'; got '%s'", atoms));
  }
  GC_ASSIGN_OR_RETURN(
      o.budget, params.GetDouble(
                    "budget", o.atoms == AtomoAtoms::kSpectral ? 2.0 : 0.01));
  GC_RETURN_IF_ERROR(params.CheckAllUsed("atomo"));
  GC_RETURN_IF_ERROR(CheckOptions(o));
  return std::make_unique<AtomoCodec>(o);
}

AtomoCodec::AtomoCodec(const AtomoOptions& options)
    : options_(options), info_(AtomoInfo()) {}

absl::Status AtomoCodec::Encode(const TensorView& grad, TensorState& /*state*/,
                                const StepContext& ctx, Bytes* payload) const {
  if (!AllFinite(grad.values)) {
    return absl::InvalidArgumentError(
        "atomo: the gradient holds NaN or Inf; expected finite values");
  }
  if (options_.atoms == AtomoAtoms::kSpectral) {
    return EncodeSpectral(grad, ctx, options_.budget, payload);
  }
  return EncodeEntry(grad, ctx, options_.budget, payload);
}

absl::Status AtomoCodec::DecodeAdd(absl::string_view payload, float alpha,
                                   absl::Span<float> acc) const {
  GC_ASSIGN_OR_RETURN(
      const ParsedPayload parsed,
      ParsePayload(payload, CodecId::kAtomo, /*round=*/0, acc.size()));
  if (parsed.header.flags != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "atomo: expected header flags 0 (not a dense body), got 0x%02x",
        parsed.header.flags));
  }
  if (parsed.params.size() != kParamBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("atomo: expected %d parameter bytes, got %d",
                        kParamBytes, parsed.params.size()));
  }
  if (parsed.params[1] != 0 || parsed.params[2] != 0 || parsed.params[3] != 0) {
    return absl::InvalidArgumentError(
        "atomo: expected parameter bytes 1..3 to be zero");
  }
  uint32_t count;
  uint64_t rows;
  std::memcpy(&count, parsed.params.data() + 4, sizeof(count));
  std::memcpy(&rows, parsed.params.data() + 8, sizeof(rows));
  switch (static_cast<uint8_t>(parsed.params[0])) {
    case static_cast<uint8_t>(AtomoAtoms::kSpectral):
      return DecodeSpectral(parsed, count, rows, alpha, acc);
    case static_cast<uint8_t>(AtomoAtoms::kEntry):
      return DecodeEntry(parsed, count, rows, alpha, acc);
    default:
      return absl::InvalidArgumentError(absl::StrFormat(
          "atomo: expected atoms 1 (spectral) or 2 (entry), got %d",
          static_cast<uint8_t>(parsed.params[0])));
  }
}

absl::Status RegisterAtomo(CodecRegistry& registry) {
  return registry.Register(
      AtomoInfo(),
      [](const CodecParams& params) -> absl::StatusOr<std::unique_ptr<Codec>> {
        GC_ASSIGN_OR_RETURN(std::unique_ptr<AtomoCodec> codec,
                            AtomoCodec::Create(params));
        return std::unique_ptr<Codec>(std::move(codec));
      });
}

}  // namespace gradcomp::codecs
