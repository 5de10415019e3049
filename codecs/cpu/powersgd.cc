#include "codecs/cpu/powersgd.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "Eigen/Dense"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "codecs/cpu/kernels.h"
#include "codecs/cpu/linalg.h"
#include "codecs/cpu/parallel.h"
#include "codecs/random.h"
#include "codecs/wire.h"

namespace gradcomp::codecs {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the parameter block is written with host-order memcpy");

constexpr int64_t kMaxRank = 1024;
constexpr size_t kParamBytes = 16;
constexpr uint8_t kFormDense = 0;
constexpr uint8_t kFormLowRank = 1;

using RowMatrix =
    Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatrixMap = Eigen::Map<RowMatrix>;
using ConstMatrixMap = Eigen::Map<const RowMatrix>;

ConstMatrixMap View(const std::vector<float>& v, int64_t rows, int64_t cols) {
  return ConstMatrixMap(v.data(), rows, cols);
}

constexpr float kFloatMax = std::numeric_limits<float>::max();

// The largest |x| of v, or Inf when v holds a NaN: at most FLT_MAX exactly
// when v is finite.
float MaxMagnitude(absl::Span<const float> v) {
  float largest = 0;
  bool nan = false;
  for (float x : v) {
    const float a = std::fabs(x);
    largest = a > largest ? a : largest;
    nan |= a != a;
  }
  return nan ? std::numeric_limits<float>::infinity() : largest;
}

// The largest |a[i, column]| of a row-major rows x cols matrix, Inf with a
// NaN.
float ColumnMaxMagnitude(const std::vector<float>& a, int64_t rows,
                         int64_t cols, int64_t column) {
  float largest = 0;
  for (int64_t i = 0; i < rows; ++i) {
    const float x = std::fabs(a[i * cols + column]);
    if (x != x) return std::numeric_limits<float>::infinity();
    largest = std::max(largest, x);
  }
  return largest;
}

// M is processed in bands of whole rows, about 2^16 values each (256 KiB of
// fp32, in L2): M = g + e is formed band by band and never materialised
// whole (no matrix-sized temporary per step: 100 MB of page faults and
// copies at 5000 x 5000), and bands are what threads share out. The bands
// depend on the shape alone, and M^T P_hat adds the bands' products in a
// fixed grouping, so results do not depend on the number of threads.
constexpr int64_t kBandValues = int64_t{1} << 16;
// M^T P_hat: the bands' products are summed within each of at most this
// many groups of consecutive bands, then the groups in order.
constexpr size_t kProductGroups = 16;
// Threads only for matrices of at least this many values.
constexpr size_t kThreadedValues = size_t{1} << 20;

// Bands of a rows x cols matrix.
class Bands {
 public:
  Bands(int64_t rows, int64_t cols)
      : rows_(rows),
        cols_(cols),
        band_rows_(
            std::max<int64_t>(1, kBandValues / std::max<int64_t>(cols, 1))),
        count_(static_cast<size_t>((rows + band_rows_ - 1) / band_rows_)) {}

  size_t count() const { return count_; }
  int64_t band_rows() const { return band_rows_; }
  int64_t first_row(size_t band) const {
    return static_cast<int64_t>(band) * band_rows_;
  }
  int64_t rows(size_t band) const {
    return std::min(band_rows_, rows_ - first_row(band));
  }

  // fn(first, last, part) over ranges of bands, on threads for large
  // matrices; every part gets at least `min_bands` bands.
  void For(
      size_t min_bands,
      absl::FunctionRef<void(size_t first, size_t last, int part)> fn) const {
    ParallelFor(count_, Options(min_bands), fn);
  }
  int Parts(size_t min_bands) const {
    return ParallelParts(count_, Options(min_bands));
  }

 private:
  ParallelOptions Options(size_t min_bands) const {
    const bool threaded = static_cast<size_t>(rows_ * cols_) >= kThreadedValues;
    return {
        threaded ? std::max<size_t>(min_bands, 1) : std::max<size_t>(count_, 1),
        1};
  }

  int64_t rows_;
  int64_t cols_;
  int64_t band_rows_;
  size_t count_;
};

// A part's bands: about 2^18 values, against tens of microseconds to start
// a thread.
constexpr size_t kMinBandsPerPart = 4;

// The CPU's products: M in bands (above), Eigen for the band products.
class CpuPowerSgdSession : public PowerSgdSession {
 public:
  CpuPowerSgdSession(const PowerSgdOptions& options, const PowerSgdPlan& plan,
                     const TensorView& grad, TensorState& state,
                     const StepContext& ctx)
      : PowerSgdSession(options, plan, grad, state, ctx, /*backend=*/""),
        bands_(plan.rows, plan.cols) {}

 private:
  // Rows [first, first + count) of M = g + e into `m`. The residual, if
  // any, is the one of the step's start: the state changes in
  // UpdateResidual only.
  void LoadRows(int64_t first, int64_t count, float* m) const {
    const size_t begin = static_cast<size_t>(first * plan().cols);
    const size_t size = static_cast<size_t>(count * plan().cols);
    const float* g = grad().values.data() + begin;
    if (error_ == nullptr) {
      std::copy_n(g, size, m);
      return;
    }
    const float* e = error_ + begin;
    for (size_t i = 0; i < size; ++i) m[i] = g[i] + e[i];
  }

  absl::StatusOr<std::vector<float>> MultiplyP(
      const std::vector<float>& q) override {
    const PowerSgdPlan& plan = this->plan();
    error_ = FindResidual();
    std::vector<float> p(static_cast<size_t>(plan.rows * plan.rank));
    std::vector<float> largest(bands_.Parts(kMinBandsPerPart), 0.0f);
    bands_.For(kMinBandsPerPart, [&](size_t first, size_t last, int part) {
      std::vector<float> m(static_cast<size_t>(bands_.band_rows() * plan.cols));
      for (size_t band = first; band < last; ++band) {
        const int64_t row = bands_.first_row(band), rows = bands_.rows(band);
        LoadRows(row, rows, m.data());
        largest[part] =
            std::max(largest[part],
                     MaxMagnitude(absl::MakeConstSpan(
                         m.data(), static_cast<size_t>(rows * plan.cols))));
        MatrixMap(p.data() + row * plan.rank, rows, plan.rank).noalias() =
            ConstMatrixMap(m.data(), rows, plan.cols) *
            View(q, plan.cols, plan.rank);
      }
    });
    m_largest_ = *std::max_element(largest.begin(), largest.end());
    if (!(m_largest_ <= kFloatMax)) return NonFiniteInput();
    return p;
  }

  absl::StatusOr<std::vector<float>> MultiplyQ(
      std::vector<float> p_sum) override {
    const PowerSgdPlan& plan = this->plan();
    p_hat_ = std::move(p_sum);
    OrthonormalizeColumns(absl::MakeSpan(p_hat_), plan.rows, plan.rank);
    // M^T P_hat = sum over bands of M_band^T P_hat_band: summed band by band
    // within each group, then group by group, in order.
    const size_t q_size = static_cast<size_t>(plan.cols * plan.rank);
    const size_t groups = std::min(kProductGroups, bands_.count());
    std::vector<std::vector<float>> partial(groups);
    const auto group_first = [&](size_t group) {
      return group * bands_.count() / groups;
    };
    ParallelFor(groups,
                {/*min_per_part=*/static_cast<size_t>(plan.rows * plan.cols) >=
                         kThreadedValues
                     ? 1
                     : groups,
                 /*align=*/1},
                [&](size_t first_group, size_t last_group, int) {
                  std::vector<float> m(
                      static_cast<size_t>(bands_.band_rows() * plan.cols));
                  for (size_t group = first_group; group < last_group;
                       ++group) {
                    partial[group].resize(q_size);
                    MatrixMap sum(partial[group].data(), plan.cols, plan.rank);
                    for (size_t band = group_first(group);
                         band < group_first(group + 1); ++band) {
                      const int64_t row = bands_.first_row(band);
                      const int64_t rows = bands_.rows(band);
                      LoadRows(row, rows, m.data());
                      const ConstMatrixMap m_band(m.data(), rows, plan.cols);
                      const ConstMatrixMap p_band(
                          p_hat_.data() + row * plan.rank, rows, plan.rank);
                      if (band == group_first(group)) {
                        sum.noalias() = m_band.transpose() * p_band;
                      } else {
                        sum.noalias() += m_band.transpose() * p_band;
                      }
                    }
                  }
                });
    std::vector<float> own_q = std::move(partial[0]);
    for (size_t group = 1; group < groups; ++group) {
      for (size_t i = 0; i < q_size; ++i) own_q[i] += partial[group][i];
    }
    return own_q;
  }

  // `error` is the same storage as error_ when there was a residual: the
  // state's Buffer keeps a buffer of the right size as it is. It is written
  // only once the new residual is known to be finite.
  absl::Status UpdateResidual(const std::vector<float>& q_mean,
                              absl::Span<float> error) override {
    const PowerSgdPlan& plan = this->plan();
    const std::vector<float> qt = Transposed(q_mean);
    if (!ResidualSurelyFinite(q_mean) && !ResidualFinite(qt)) {
      return SummedFactorOverflow();
    }
    bands_.For(kMinBandsPerPart, [&](size_t first, size_t last, int) {
      std::vector<float> approx(static_cast<size_t>(plan.cols));
      for (int64_t row = bands_.first_row(first);
           row < bands_.first_row(first) + RowsOf(first, last); ++row) {
        ResidualRow(qt, row, approx.data(), error.data() + row * plan.cols);
      }
    });
    error_ = nullptr;
    return absl::OkStatus();
  }

  // Row `row` of the new residual M - P_hat q^T into `out` (cols values),
  // from qt = q^T, with `approx` (cols values) as scratch. M = g + e (the
  // old e, each value read before `out`, which may be its row, is written)
  // or g alone.
  void ResidualRow(const std::vector<float>& qt, int64_t row, float* approx,
                   float* out) const {
    const size_t cols = static_cast<size_t>(plan().cols);
    ExpandRow(qt, row, approx);
    const float* g = grad().values.data() + row * plan().cols;
    if (error_ != nullptr) {
      const float* e = error_ + row * plan().cols;
      for (size_t j = 0; j < cols; ++j) out[j] = (g[j] + e[j]) - approx[j];
    } else {
      for (size_t j = 0; j < cols; ++j) out[j] = g[j] - approx[j];
    }
  }

  // Whether M - P_hat q^T is finite whatever its values, by a bound that
  // costs no pass over M: |M| <= m_largest_ and |P_hat q^T| <= sum_k
  // max|P_hat[:, k]| max|q[:, k]|, with 2^-10 of room for the rounding of
  // the rank-r sums (at most 2r + 1 roundings of 2^-24 each). A normal step
  // is many orders of magnitude inside it.
  bool ResidualSurelyFinite(const std::vector<float>& q) const {
    const PowerSgdPlan& plan = this->plan();
    double bound = m_largest_;
    for (int64_t k = 0; k < plan.rank; ++k) {
      bound += static_cast<double>(
                   ColumnMaxMagnitude(p_hat_, plan.rows, plan.rank, k)) *
               ColumnMaxMagnitude(q, plan.cols, plan.rank, k);
    }
    return bound * (1 + 1.0 / 1024) <= kFloatMax;
  }

  // Whether every value of M - P_hat q^T is finite, computed as
  // UpdateResidual computes it but written nowhere: a pass over M, taken
  // only where ResidualSurelyFinite cannot tell (a huge summed Q).
  bool ResidualFinite(const std::vector<float>& qt) const {
    const size_t cols = static_cast<size_t>(plan().cols);
    std::vector<char> finite(bands_.Parts(kMinBandsPerPart), 1);
    bands_.For(kMinBandsPerPart, [&](size_t first, size_t last, int part) {
      std::vector<float> approx(cols), out(cols);
      for (int64_t row = bands_.first_row(first);
           row < bands_.first_row(first) + RowsOf(first, last); ++row) {
        ResidualRow(qt, row, approx.data(), out.data());
        finite[part] &= AllFinite(out);
      }
    });
    return std::all_of(finite.begin(), finite.end(), [](char c) { return c; });
  }

  // out = P_hat q^T, rows x cols.
  absl::Status Expand(const std::vector<float>& q,
                      absl::Span<float> out) override {
    const std::vector<float> qt = Transposed(q);
    bands_.For(kMinBandsPerPart, [&](size_t first, size_t last, int) {
      for (int64_t row = bands_.first_row(first);
           row < bands_.first_row(first) + RowsOf(first, last); ++row) {
        ExpandRow(qt, row, out.data() + row * plan().cols);
      }
    });
    return absl::OkStatus();
  }

  // Rows of bands [first, last).
  int64_t RowsOf(size_t first, size_t last) const {
    return last > first ? bands_.first_row(last - 1) + bands_.rows(last - 1) -
                              bands_.first_row(first)
                        : 0;
  }

  // q (cols x rank) as rank x cols, so that expanding a row reads each of
  // q's columns contiguously.
  std::vector<float> Transposed(const std::vector<float>& q) const {
    const PowerSgdPlan& plan = this->plan();
    std::vector<float> qt(q.size());
    for (int64_t j = 0; j < plan.cols; ++j) {
      for (int64_t k = 0; k < plan.rank; ++k) {
        qt[k * plan.cols + j] = q[j * plan.rank + k];
      }
    }
    return qt;
  }

  // Row `row` of P_hat q^T into `out` (cols values), from qt = q^T: written
  // once, the rank-r terms added in order (a general matrix product would
  // zero the 100 MB output first and then read it back).
  void ExpandRow(const std::vector<float>& qt, int64_t row, float* out) const {
    const PowerSgdPlan& plan = this->plan();
    const size_t cols = static_cast<size_t>(plan.cols);
    const float* p = p_hat_.data() + row * plan.rank;
    const float p0 = p[0];
    for (size_t j = 0; j < cols; ++j) out[j] = p0 * qt[j];
    for (int64_t k = 1; k < plan.rank; ++k) {
      const float pk = p[k];
      const float* qk = qt.data() + k * plan.cols;
      for (size_t j = 0; j < cols; ++j) out[j] += pk * qk[j];
    }
  }

  const Bands bands_;
  const float* error_ = nullptr;  // e at the step's start, if any (numel)
  float m_largest_ = 0;           // max |M|, from MultiplyP
  std::vector<float> p_hat_;      // orthonormalised sum of P
};

}  // namespace

Round MakePowerSgdRound(const PowerSgdPlan& plan, uint64_t numel,
                        uint8_t round_index, absl::Span<const float> body) {
  char params[kParamBytes] = {};
  params[0] = static_cast<char>(ElemType::kF32);
  params[1] = static_cast<char>(plan.dense() ? kFormDense : kFormLowRank);
  const uint32_t rank = static_cast<uint32_t>(plan.rank);
  const uint64_t rows = static_cast<uint64_t>(plan.rows);
  std::memcpy(params + 4, &rank, sizeof(rank));
  std::memcpy(params + 8, &rows, sizeof(rows));
  Round round;
  round.collective = Collective::kSum;
  WireHeader header;
  header.codec = CodecId::kPowerSgd;
  header.round = round_index;
  header.flags = kFlagDenseBody;
  header.numel = numel;
  // WriteDensePayload's parameter block is the element type alone; this
  // codec's block also names the form, rank and rows.
  char* out = BeginPayload(header, absl::string_view(params, kParamBytes),
                           body.size() * sizeof(float), &round.payload);
  if (!body.empty()) std::memcpy(out, body.data(), body.size() * sizeof(float));
  return round;
}

absl::Status CheckPowerSgdSum(absl::Span<const float> sum, int64_t expected,
                              absl::string_view what) {
  if (sum.size() != static_cast<size_t>(expected)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("powersgd: expected a sum of %d %s values, got %d",
                        expected, what, sum.size()));
  }
  if (!AllFinite(sum)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "powersgd: the sum of %s holds NaN or Inf; expected finite values",
        what));
  }
  return absl::OkStatus();
}

PowerSgdSession::PowerSgdSession(const PowerSgdOptions& options,
                                 const PowerSgdPlan& plan,
                                 const TensorView& grad, TensorState& state,
                                 const StepContext& ctx,
                                 absl::string_view backend)
    : options_(options),
      plan_(plan),
      grad_(grad),
      state_(state),
      ctx_(ctx),
      backend_(backend) {}

absl::StatusOr<std::optional<Round>> PowerSgdSession::NextRound() {
  switch (stage_) {
    case Stage::kStart: {
      if (plan_.dense()) {
        GC_RETURN_IF_ERROR(LoadDense());
        stage_ = Stage::kAwaitDense;
        return MakePowerSgdRound(plan_, grad_.numel(), 0, DenseValues());
      }
      GC_ASSIGN_OR_RETURN(const std::vector<float> p, MultiplyP(InitialQ()));
      stage_ = Stage::kAwaitP;
      return MakePowerSgdRound(plan_, grad_.numel(), 0, p);
    }
    case Stage::kHaveP:
      stage_ = Stage::kAwaitQ;
      return MakePowerSgdRound(plan_, grad_.numel(), 1, own_q_);
    case Stage::kDone:
      return std::optional<Round>();
    default:
      return OutOfOrder("NextRound", "the last round was not absorbed");
  }
}

absl::Status PowerSgdSession::Absorb(RoundResult result) {
  if (result.world_size < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "powersgd: expected a world size >= 1, got %d", result.world_size));
  }
  switch (stage_) {
    case Stage::kAwaitDense:
      GC_RETURN_IF_ERROR(
          CheckPowerSgdSum(result.sum, grad_.numel(), "dense values"));
      sum_ = std::move(result.sum);
      world_size_ = result.world_size;
      // The residual went out with this exact step: nothing is owed.
      if (!dense_m_.empty()) state_.Erase(kPowerSgdErrorBuffer);
      stage_ = Stage::kDone;
      return absl::OkStatus();
    case Stage::kAwaitP: {
      GC_RETURN_IF_ERROR(
          CheckPowerSgdSum(result.sum, plan_.rows * plan_.rank, "P"));
      GC_ASSIGN_OR_RETURN(own_q_, MultiplyQ(std::move(result.sum)));
      stage_ = Stage::kHaveP;
      return absl::OkStatus();
    }
    case Stage::kAwaitQ:
      GC_RETURN_IF_ERROR(
          CheckPowerSgdSum(result.sum, plan_.cols * plan_.rank, "Q"));
      return AbsorbQ(std::move(result.sum), result.world_size);
    default:
      return OutOfOrder("Absorb", "no round is waiting for its result");
  }
}

absl::Status PowerSgdSession::Finish(absl::Span<float> out) {
  GC_RETURN_IF_ERROR(CheckDone("Finish", out));
  if (plan_.dense()) {
    const float w = static_cast<float>(world_size_);
    for (size_t i = 0; i < out.size(); ++i) out[i] = sum_[i] / w;
    return absl::OkStatus();
  }
  return Expand(q_mean_, out);
}

absl::Status PowerSgdSession::DecodeOwn(absl::Span<float> out) {
  GC_RETURN_IF_ERROR(CheckDone("DecodeOwn", out));
  if (plan_.dense()) {
    const absl::Span<const float> values = DenseValues();
    std::copy(values.begin(), values.end(), out.begin());
    return absl::OkStatus();
  }
  return Expand(own_q_, out);
}

absl::Span<const float> PowerSgdSession::DenseValues() const {
  return dense_m_.empty() ? grad_.values : absl::MakeConstSpan(dense_m_);
}

absl::Status PowerSgdSession::LoadDense() {
  const float* error = FindResidual();
  if (error == nullptr) return absl::OkStatus();
  dense_m_.resize(grad_.numel());
  for (size_t i = 0; i < dense_m_.size(); ++i) {
    dense_m_[i] = grad_.values[i] + error[i];
  }
  if (!AllFinite(dense_m_)) {
    dense_m_.clear();
    return NonFiniteInput();
  }
  return absl::OkStatus();
}

const float* PowerSgdSession::FindResidual() {
  std::optional<absl::Span<float>> error = state_.Find(kPowerSgdErrorBuffer);
  return error.has_value() && error->size() == grad_.numel() ? error->data()
                                                             : nullptr;
}

absl::Status PowerSgdSession::NonFiniteInput() {
  return absl::InvalidArgumentError(
      "powersgd: the gradient plus its error feedback holds NaN or Inf; "
      "expected finite values");
}

absl::Status PowerSgdSession::SummedFactorOverflow() {
  return absl::InvalidArgumentError(
      "powersgd: the summed factor Q overflowed: the approximation P_hat "
      "(sum Q / W)^T, or the residual M minus it, would hold NaN or Inf "
      "although the sum is finite; the step is refused and the state is "
      "unchanged");
}

std::vector<float> PowerSgdSession::InitialQ() {
  const size_t q_size = static_cast<size_t>(plan_.cols * plan_.rank);
  std::vector<float> q;
  std::optional<absl::Span<float>> warm = state_.Find(kPowerSgdQBuffer);
  if (options_.warm_start && warm.has_value() && warm->size() == q_size) {
    q.assign(warm->begin(), warm->end());
  }
  if (q.empty() ||
      OrthonormalizeColumns(absl::MakeSpan(q), plan_.cols, plan_.rank) > 0) {
    q.resize(q_size);
    FillGaussian(PhiloxStream(ctx_.seed, ctx_.tensor_id, ctx_.step, 0), 0,
                 absl::MakeSpan(q));
    OrthonormalizeColumns(absl::MakeSpan(q), plan_.cols, plan_.rank);
  }
  return q;
}

// The step's result is known: the state moves on (residual, warm start).
absl::Status PowerSgdSession::AbsorbQ(std::vector<float> q_sum,
                                      int world_size) {
  q_mean_ = std::move(q_sum);
  const float w = static_cast<float>(world_size);
  for (float& v : q_mean_) v /= w;
  GC_RETURN_IF_ERROR(UpdateResidual(
      q_mean_, state_.Buffer(kPowerSgdErrorBuffer, grad_.numel())));
  if (options_.warm_start) {
    absl::Span<float> warm = state_.Buffer(kPowerSgdQBuffer, q_mean_.size());
    std::copy(q_mean_.begin(), q_mean_.end(), warm.begin());
  }
  stage_ = Stage::kDone;
  return absl::OkStatus();
}

absl::Status PowerSgdSession::CheckDone(absl::string_view call,
                                        absl::Span<float> out) const {
  if (stage_ != Stage::kDone) {
    return OutOfOrder(call, "the step's rounds have not all been absorbed");
  }
  if (out.size() != grad_.numel()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("powersgd: expected an output of %d elements, got %d",
                        grad_.numel(), out.size()));
  }
  return absl::OkStatus();
}

absl::Status PowerSgdSession::OutOfOrder(absl::string_view call,
                                         absl::string_view why) const {
  return absl::FailedPreconditionError(absl::StrFormat(
      "powersgd session%s: %s called out of order: %s",
      backend_.empty() ? "" : absl::StrCat(" (", backend_, ")"), call, why));
}

PowerSgdPlan PlanPowerSgd(const PowerSgdOptions& options,
                          absl::Span<const int64_t> shape) {
  PowerSgdPlan plan;
  if (shape.size() < 2) return plan;
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  if (n == 0) return plan;
  const int64_t rows = shape[0];
  const int64_t cols = n / rows;
  const int64_t rank = std::min({options.rank, rows, cols});
  // Compressed floats r (rows + cols) against n dense ones.
  if (static_cast<double>(n) < options.min_compression_rate *
                                   static_cast<double>(rank) *
                                   static_cast<double>(rows + cols)) {
    return plan;
  }
  plan.rows = rows;
  plan.cols = cols;
  plan.rank = rank;
  return plan;
}

CodecInfo PowerSgdInfo() {
  CodecInfo info;
  info.name = "powersgd";
  info.id = CodecId::kPowerSgd;
  info.family = "low_rank";
  info.summable = true;
  info.unbiased = false;
  info.stateful = true;
  info.rounds = 2;
  info.params = {"min_compression_rate", "rank", "warm_start"};
  return info;
}

absl::StatusOr<std::unique_ptr<PowerSgdCodec>> PowerSgdCodec::Create(
    const CodecParams& params) {
  PowerSgdOptions o;
  GC_ASSIGN_OR_RETURN(o.rank, params.GetInt("rank", o.rank));
  GC_ASSIGN_OR_RETURN(
      o.min_compression_rate,
      params.GetDouble("min_compression_rate", o.min_compression_rate));
  GC_ASSIGN_OR_RETURN(o.warm_start, params.GetBool("warm_start", o.warm_start));
  GC_RETURN_IF_ERROR(params.CheckAllUsed("powersgd"));
  if (o.rank < 1 || o.rank > kMaxRank) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "powersgd: rank must be in [1, %d]; got %d", kMaxRank, o.rank));
  }
  if (!(o.min_compression_rate >= 0) ||
      !std::isfinite(o.min_compression_rate)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "powersgd: min_compression_rate must be a finite number >= 0; got %g",
        o.min_compression_rate));
  }
  return std::make_unique<PowerSgdCodec>(o);
}

PowerSgdCodec::PowerSgdCodec(const PowerSgdOptions& options)
    : options_(options), info_(PowerSgdInfo()) {}

absl::StatusOr<std::unique_ptr<CodecSession>> PowerSgdCodec::Start(
    const TensorView& grad, TensorState& state, const StepContext& ctx) const {
  if (ctx.world_size < 1 || ctx.rank < 0 || ctx.rank >= ctx.world_size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "powersgd: expected 0 <= rank < world_size, got rank %d of %d",
        ctx.rank, ctx.world_size));
  }
  int64_t n = 1;
  for (int64_t d : grad.shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("powersgd: expected dimensions >= 0, got %d", d));
    }
    n *= d;
  }
  if (static_cast<uint64_t>(n) != grad.numel()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "powersgd: the shape holds %d elements but the tensor has %d", n,
        grad.numel()));
  }
  return std::unique_ptr<CodecSession>(std::make_unique<CpuPowerSgdSession>(
      options_, PlanPowerSgd(options_, grad.shape), grad, state, ctx));
}

absl::Status RegisterPowerSgd(CodecRegistry& registry) {
  return registry.Register(
      PowerSgdInfo(),
      [](const CodecParams& params) -> absl::StatusOr<std::unique_ptr<Codec>> {
        GC_ASSIGN_OR_RETURN(std::unique_ptr<PowerSgdCodec> codec,
                            PowerSgdCodec::Create(params));
        return std::unique_ptr<Codec>(std::move(codec));
      });
}

}  // namespace gradcomp::codecs
