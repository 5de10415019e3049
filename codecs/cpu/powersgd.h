// `powersgd`: PowerSGD (Vogels, Karimireddy, Jaggi, NeurIPS 2019). Each
// tensor, seen as a matrix M = g.view(rows, -1) plus this worker's error
// feedback residual, is approximated at rank r by one step of subspace
// iteration shared by all workers, in two summed rounds:
//
//   round 0 (sum):  P = M Q              P_hat = orthonormalize(sum P)
//   round 1 (sum):  Q = M^T P_hat        Q_mean = sum Q / W
//   average = P_hat Q_mean^T;   e <- M - P_hat Q_mean^T;   warm start Q_mean
//
//   GC_ASSIGN_OR_RETURN(auto codec, registry.Create("powersgd",
//                           CodecParams({{"rank", "2"}})));
//
// Parameters: `rank` r (default 2, the rank of the paper's CIFAR-10
// experiments; r_eff = min(r, rows, cols)), `min_compression_rate` (default
// 2: compress only when numel >= rate * r_eff * (rows + cols), otherwise send
// dense), `warm_start` (default true). Tensors with fewer than 2 dimensions
// are sent dense. Dense tensors take one summed round of fp32 values and
// keep no residual: one left by low-rank steps (the parameters changed
// since) is sent with the values, M = g + e, and dropped, as nothing is
// owed after an exact step; the warm start's Q stays for later low-rank
// steps.
//
// Q at the start of a step is the last step's Q_mean (state "powersgd.q"),
// or, on the first step, without warm start, or when the warm start has an
// all-zero column (a zero gradient would otherwise stall the tensor for
// good), standard normals from the shared Philox stream (seed, tensor,
// step, round 0), identical on all ranks. Like PyTorch's powerSGD_hook, Q is
// orthonormalised before use: P_hat depends only on the span of Q's leading
// columns, so the result is the same, but P is better conditioned in fp32.
//
// DecodeOwn writes P_hat (M^T P_hat)^T, this worker's M projected on the
// shared subspace: the mean of the workers' own decodes is the average.
//
// Payload (after the wire header, flags DENSE_BODY): parameters are 16
// bytes, [0] element type 1 (f32), [1] form (0 dense, 1 low rank), [2..3]
// zero, [4..7] u32 r_eff (0 when dense), [8..15] u64 rows (0 when dense).
// The body is fp32: dense g (numel values); or round 0: P, rows x r_eff;
// round 1: Q, cols x r_eff; both row-major.
//
// M = g + e is formed in bands of rows and never materialised whole; large
// matrices run their bands on all cores, with the same result for any
// number of threads (powersgd.cc says how).
//
// Batching the rounds of same-shape matrices into one collective is not
// done: a session sees one tensor. docs/codecs.md has the design.
#ifndef GRADCOMP_CODECS_CPU_POWERSGD_H_
#define GRADCOMP_CODECS_CPU_POWERSGD_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "codecs/codec.h"
#include "codecs/params.h"
#include "codecs/registry.h"

namespace gradcomp::codecs {

// State buffers: the error feedback residual (numel) and the warm start Q
// (cols x r_eff, row-major).
inline constexpr absl::string_view kPowerSgdErrorBuffer = "powersgd.error";
inline constexpr absl::string_view kPowerSgdQBuffer = "powersgd.q";

struct PowerSgdOptions {
  int64_t rank = 2;                   // r, in [1, 1024]
  double min_compression_rate = 2.0;  // >= 0
  bool warm_start = true;
};

// How a tensor of `shape` is sent: as a rows x cols matrix at rank r_eff,
// or dense (rank 0).
struct PowerSgdPlan {
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t rank = 0;
  bool dense() const { return rank == 0; }
};

PowerSgdPlan PlanPowerSgd(const PowerSgdOptions& options,
                          absl::Span<const int64_t> shape);

// The payload of round `round_index` (0: P, or g when dense; 1: Q) of a
// tensor of `numel` elements sent as `plan`, with `body` as its fp32 body.
// Every backend's session sends these (codecs/cuda/powersgd.h too).
Round MakePowerSgdRound(const PowerSgdPlan& plan, uint64_t numel,
                        uint8_t round_index, absl::Span<const float> body);

// OK when a round's sum holds `expected` values, all finite; otherwise
// InvalidArgument naming `what` ("P", "Q", "dense values").
absl::Status CheckPowerSgdSum(absl::Span<const float> sum, int64_t expected,
                              absl::string_view what);

// One tensor's PowerSGD step: the bookkeeping every backend's session
// shares (codecs/cuda/powersgd.cc too). It orders the calls, checks each
// round's sum, sends a dense plan's values, makes the step's first Q (the
// warm start, or Philox normals, orthonormalised), takes Q's mean, and
// moves the state on (residual, warm start) when the last round is in. A
// backend supplies the four products of a low-rank step.
class PowerSgdSession : public CodecSession {
 public:
  absl::StatusOr<std::optional<Round>> NextRound() final;
  absl::Status Absorb(RoundResult result) final;
  absl::Status Finish(absl::Span<float> out) final;
  absl::Status DecodeOwn(absl::Span<float> out) final;

 protected:
  // `backend` names the session in out-of-order errors ("", "GPU").
  PowerSgdSession(const PowerSgdOptions& options, const PowerSgdPlan& plan,
                  const TensorView& grad, TensorState& state,
                  const StepContext& ctx, absl::string_view backend);

  // P = M Q for the step's Q (cols x rank): this worker's round-0 body
  // (rows x rank). M = g + FindResidual(). InvalidArgument (NonFiniteInput)
  // when M holds NaN or Inf.
  virtual absl::StatusOr<std::vector<float>> MultiplyP(
      const std::vector<float>& q) = 0;
  // M^T P_hat, P_hat = p_sum orthonormalised: this worker's round-1 body
  // (cols x rank).
  virtual absl::StatusOr<std::vector<float>> MultiplyQ(
      std::vector<float> p_sum) = 0;
  // error <- M - P_hat q_mean^T. `error` is the state's residual buffer: the
  // residual of the step's start, when FindResidual found one. When a value
  // of the new residual would be NaN or Inf (a finite but huge summed Q),
  // InvalidArgument (SummedFactorOverflow) with `error` untouched, so that
  // the step fails and every later one can still succeed.
  virtual absl::Status UpdateResidual(const std::vector<float>& q_mean,
                                      absl::Span<float> error) = 0;
  // out = P_hat q^T.
  virtual absl::Status Expand(const std::vector<float>& q,
                              absl::Span<float> out) = 0;

  // The residual of the step's start (numel values), or null.
  const float* FindResidual();
  static absl::Status NonFiniteInput();
  static absl::Status SummedFactorOverflow();

  const PowerSgdPlan& plan() const { return plan_; }
  const TensorView& grad() const { return grad_; }

 private:
  enum class Stage { kStart, kAwaitDense, kAwaitP, kHaveP, kAwaitQ, kDone };

  // A dense step's M = g + e into dense_m_ when a residual is left from
  // low-rank steps (dense_m_ stays empty, and g is sent, otherwise).
  // InvalidArgument (NonFiniteInput) when M holds NaN or Inf.
  absl::Status LoadDense();
  // What a dense step sends and decodes as its own: M, or g alone.
  absl::Span<const float> DenseValues() const;
  std::vector<float> InitialQ();
  absl::Status AbsorbQ(std::vector<float> q_sum, int world_size);
  absl::Status CheckDone(absl::string_view call, absl::Span<float> out) const;
  absl::Status OutOfOrder(absl::string_view call, absl::string_view why) const;

  const PowerSgdOptions options_;
  const PowerSgdPlan plan_;
  const TensorView grad_;
  TensorState& state_;
  const StepContext ctx_;
  const std::string backend_;
  Stage stage_ = Stage::kStart;
  std::vector<float> own_q_;    // M^T P_hat, this worker's round-1 body
  std::vector<float> q_mean_;   // sum of Q / W
  std::vector<float> sum_;      // dense: the sum of g (or of M)
  std::vector<float> dense_m_;  // dense with a residual: M = g + e
  int world_size_ = 1;
};

class PowerSgdCodec : public Codec {
 public:
  // Parses and checks "rank", "min_compression_rate" and "warm_start";
  // rejects unknown names.
  static absl::StatusOr<std::unique_ptr<PowerSgdCodec>> Create(
      const CodecParams& params);

  explicit PowerSgdCodec(const PowerSgdOptions& options);

  const CodecInfo& info() const override { return info_; }
  const PowerSgdOptions& options() const { return options_; }

  absl::StatusOr<std::unique_ptr<CodecSession>> Start(
      const TensorView& grad, TensorState& state,
      const StepContext& ctx) const override;

 private:
  PowerSgdOptions options_;
  CodecInfo info_;
};

CodecInfo PowerSgdInfo();

// Registers "powersgd".
absl::Status RegisterPowerSgd(CodecRegistry& registry);

}  // namespace gradcomp::codecs

#endif  // GRADCOMP_CODECS_CPU_POWERSGD_H_
