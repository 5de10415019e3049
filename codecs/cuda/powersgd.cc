#include "codecs/cuda/powersgd.h"

#include <cublas_v2.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "codecs/cpu/linalg.h"
#include "codecs/cuda/powersgd_kernels.h"
#include "codecs/random.h"

namespace gradcomp::codecs::cuda {
namespace {

absl::Status CublasStatus(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrFormat("%s failed: %s (%s)", what,
                                             cublasGetStatusName(status),
                                             cublasGetStatusString(status)));
}

#define GC_CUBLAS_RETURN_IF_ERROR(expr) \
  GC_RETURN_IF_ERROR(CublasStatus((expr), #expr))

// cuBLAS's sizes are ints.
absl::Status CheckGemmSize(const PowerSgdPlan& plan) {
  if (plan.rows > INT_MAX || plan.cols > INT_MAX) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "powersgd (GPU): expected rows and columns <= %d, got %d x %d", INT_MAX,
        plan.rows, plan.cols));
  }
  return absl::OkStatus();
}

absl::Status Upload(absl::Span<const float> host, float* device) {
  if (host.empty()) return absl::OkStatus();
  GC_CUDA_RETURN_IF_ERROR(cudaMemcpy(device, host.data(),
                                     host.size() * sizeof(float),
                                     cudaMemcpyHostToDevice));
  return absl::OkStatus();
}

absl::Status Download(const float* device, absl::Span<float> host) {
  if (host.empty()) return absl::OkStatus();
  GC_CUDA_RETURN_IF_ERROR(cudaMemcpy(host.data(), device,
                                     host.size() * sizeof(float),
                                     cudaMemcpyDeviceToHost));
  return absl::OkStatus();
}

bool AllFinite(absl::Span<const float> v) {
  return std::all_of(v.begin(), v.end(),
                     [](float x) { return std::isfinite(x); });
}

}  // namespace

struct PowerSgdGpu::Handle {
  cublasHandle_t cublas = nullptr;
};

absl::StatusOr<std::unique_ptr<PowerSgdGpu>> PowerSgdGpu::Create() {
  GC_RETURN_IF_ERROR(CudaDeviceAvailable());
  auto handle = std::make_unique<Handle>();
  GC_CUBLAS_RETURN_IF_ERROR(cublasCreate(&handle->cublas));
  std::unique_ptr<PowerSgdGpu> gpu(new PowerSgdGpu(handle.release()));
  // Plain fp32 products: no TF32 tensor cores, no reduced-precision
  // reductions, whatever NVIDIA_TF32_OVERRIDE says.
  GC_CUBLAS_RETURN_IF_ERROR(
      cublasSetMathMode(gpu->handle_->cublas, CUBLAS_PEDANTIC_MATH));
  return gpu;
}

PowerSgdGpu::PowerSgdGpu(Handle* handle) : handle_(handle) {}

PowerSgdGpu::~PowerSgdGpu() {
  cublasDestroy(handle_->cublas);
  delete handle_;
}

absl::Status PowerSgdGpu::FormM(const float* g, const float* e, size_t n,
                                float* m) {
  GC_CUDA_RETURN_IF_ERROR(LaunchAddArrays(g, e, n, m, nullptr));
  return absl::OkStatus();
}

absl::Status PowerSgdGpu::FormMAndMultiplyP(const PowerSgdPlan& plan,
                                            const float* g, const float* e,
                                            const float* p_old,
                                            const float* q_old, const float* q,
                                            float* m, float* p) {
  const size_t rows = static_cast<size_t>(plan.rows);
  const size_t cols = static_cast<size_t>(plan.cols);
  const size_t rank = static_cast<size_t>(plan.rank);
  if (rank <= kFusedMaxRank) {
    GC_CUDA_RETURN_IF_ERROR(LaunchFormMAndMultiply(g, e, p_old, q_old, q, rows,
                                                   cols, rank, m, p, nullptr));
    return absl::OkStatus();
  }
  GC_RETURN_IF_ERROR(FormM(g, e, rows * cols, m));
  if (p_old != nullptr) {
    GC_RETURN_IF_ERROR(SubtractLowRank(plan, p_old, q_old, m));
  }
  return MultiplyP(plan, m, q, p);
}

absl::Status PowerSgdGpu::Gemm(bool transpose_a, bool transpose_b, size_t m,
                               size_t n, size_t k, float alpha, const float* a,
                               size_t lda, const float* b, size_t ldb,
                               float beta, float* c, size_t ldc) {
  GC_CUBLAS_RETURN_IF_ERROR(
      cublasSgemm(handle_->cublas, transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                  transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(m),
                  static_cast<int>(n), static_cast<int>(k), &alpha, a,
                  static_cast<int>(lda), b, static_cast<int>(ldb), &beta, c,
                  static_cast<int>(ldc)));
  return absl::OkStatus();
}

// cuBLAS is column-major: a row-major rows x cols matrix is, to it, the
// column-major cols x rows matrix of its transpose. So each product below
// is written for the transposes.

absl::Status PowerSgdGpu::MultiplyP(const PowerSgdPlan& plan, const float* m,
                                    const float* q, float* p) {
  GC_RETURN_IF_ERROR(CheckGemmSize(plan));
  // P^T (r x rows) = Q^T (r x cols) M^T (cols x rows).
  return Gemm(false, false, plan.rank, plan.rows, plan.cols, 1.0f, q, plan.rank,
              m, plan.cols, 0.0f, p, plan.rank);
}

absl::Status PowerSgdGpu::MultiplyQ(const PowerSgdPlan& plan, const float* m,
                                    const float* p_hat, float* q) {
  GC_RETURN_IF_ERROR(CheckGemmSize(plan));
  // Q^T (r x cols) = P_hat^T (r x rows) M (rows x cols).
  return Gemm(false, true, plan.rank, plan.cols, plan.rows, 1.0f, p_hat,
              plan.rank, m, plan.cols, 0.0f, q, plan.rank);
}

absl::Status PowerSgdGpu::SubtractLowRank(const PowerSgdPlan& plan,
                                          const float* p_hat, const float* q,
                                          float* m) {
  GC_RETURN_IF_ERROR(CheckGemmSize(plan));
  // M^T (cols x rows) -= Q (cols x r) P_hat^T (r x rows).
  return Gemm(true, false, plan.cols, plan.rows, plan.rank, -1.0f, q, plan.rank,
              p_hat, plan.rank, 1.0f, m, plan.cols);
}

absl::Status PowerSgdGpu::Expand(const PowerSgdPlan& plan, const float* p_hat,
                                 const float* q, float* out) {
  GC_RETURN_IF_ERROR(CheckGemmSize(plan));
  return Gemm(true, false, plan.cols, plan.rows, plan.rank, 1.0f, q, plan.rank,
              p_hat, plan.rank, 0.0f, out, plan.cols);
}

absl::Status PowerSgdGpu::Orthonormalize(float* a, size_t rows, size_t cols) {
  const size_t bytes = rows * cols * sizeof(double);
  if (scratch_.size() < bytes) {
    GC_ASSIGN_OR_RETURN(scratch_, DeviceBuffer::Create(bytes));
  }
  GC_CUDA_RETURN_IF_ERROR(LaunchOrthonormalizeColumns(
      a, rows, cols, scratch_.as<double>(), nullptr, nullptr));
  return absl::OkStatus();
}

// One tensor, one step: the CPU twin's session (codecs/cpu/powersgd.cc)
// with M, P and Q on the GPU. M is formed once, in device memory, and
// becomes the residual in place at the end of the step.
class CudaPowerSgdSession : public CodecSession {
 public:
  CudaPowerSgdSession(const CudaPowerSgdCodec& codec, const PowerSgdPlan& plan,
                      const TensorView& grad, TensorState& state,
                      const StepContext& ctx)
      : codec_(codec), plan_(plan), grad_(grad), state_(state), ctx_(ctx) {}

  absl::StatusOr<std::optional<Round>> NextRound() override {
    switch (stage_) {
      case Stage::kStart:
        GC_RETURN_IF_ERROR(ComputeP());
        stage_ = Stage::kAwaitP;
        return MakePowerSgdRound(plan_, grad_.numel(), 0, p_);
      case Stage::kHaveP:
        stage_ = Stage::kAwaitQ;
        return MakePowerSgdRound(plan_, grad_.numel(), 1, own_q_);
      case Stage::kDone:
        return std::optional<Round>();
      default:
        return OutOfOrder("NextRound", "the last round was not absorbed");
    }
  }

  absl::Status Absorb(RoundResult result) override {
    if (result.world_size < 1) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "powersgd: expected a world size >= 1, got %d", result.world_size));
    }
    switch (stage_) {
      case Stage::kAwaitP:
        GC_RETURN_IF_ERROR(
            CheckPowerSgdSum(result.sum, plan_.rows * plan_.rank, "P"));
        return AbsorbP(result.sum);
      case Stage::kAwaitQ:
        GC_RETURN_IF_ERROR(
            CheckPowerSgdSum(result.sum, plan_.cols * plan_.rank, "Q"));
        return AbsorbQ(std::move(result.sum), result.world_size);
      default:
        return OutOfOrder("Absorb", "no round is waiting for its result");
    }
  }

  absl::Status Finish(absl::Span<float> out) override {
    GC_RETURN_IF_ERROR(CheckDone("Finish", out));
    return Expand(q_mean_, out);
  }

  absl::Status DecodeOwn(absl::Span<float> out) override {
    GC_RETURN_IF_ERROR(CheckDone("DecodeOwn", out));
    return Expand(own_q_, out);
  }

 private:
  enum class Stage { kStart, kAwaitP, kHaveP, kAwaitQ, kDone };

  size_t p_size() const { return static_cast<size_t>(plan_.rows * plan_.rank); }
  size_t q_size() const { return static_cast<size_t>(plan_.cols * plan_.rank); }

  // The step's Q, exactly as the CPU twin makes it (on the host, with its
  // functions): the warm start, orthonormalised, or Philox normals.
  std::vector<float> InitialQ() {
    std::vector<float> q;
    std::optional<absl::Span<float>> warm = state_.Find(kPowerSgdQBuffer);
    if (codec_.options().warm_start && warm.has_value() &&
        warm->size() == q_size()) {
      q.assign(warm->begin(), warm->end());
    }
    if (q.empty() ||
        OrthonormalizeColumns(absl::MakeSpan(q), plan_.cols, plan_.rank) > 0) {
      q.resize(q_size());
      FillGaussian(PhiloxStream(ctx_.seed, ctx_.tensor_id, ctx_.step, 0), 0,
                   absl::MakeSpan(q));
      OrthonormalizeColumns(absl::MakeSpan(q), plan_.cols, plan_.rank);
    }
    return q;
  }

  absl::Status ComputeP() {
    const size_t n = grad_.numel();
    const std::vector<float> q = InitialQ();
    absl::MutexLock lock(&codec_.mu_);
    GC_ASSIGN_OR_RETURN(PowerSgdGpu * gpu, codec_.Gpu());
    GC_ASSIGN_OR_RETURN(m_, DeviceBuffer::Create(n * sizeof(float)));
    GC_ASSIGN_OR_RETURN(p_device_,
                        DeviceBuffer::Create(p_size() * sizeof(float)));
    GC_ASSIGN_OR_RETURN(q_device_,
                        DeviceBuffer::Create(q_size() * sizeof(float)));
    GC_RETURN_IF_ERROR(Upload(grad_.values, m_.as<float>()));
    GC_RETURN_IF_ERROR(Upload(q, q_device_.as<float>()));
    // The residual of the step's start, if any; the state changes in
    // AbsorbQ only.
    std::optional<absl::Span<float>> error = state_.Find(kPowerSgdErrorBuffer);
    if (error.has_value() && error->size() == n) {
      GC_ASSIGN_OR_RETURN(DeviceBuffer e,
                          DeviceBuffer::Create(n * sizeof(float)));
      GC_RETURN_IF_ERROR(Upload(*error, e.as<float>()));
      GC_RETURN_IF_ERROR(gpu->FormMAndMultiplyP(
          plan_, m_.as<float>(), e.as<float>(), nullptr, nullptr,
          q_device_.as<float>(), m_.as<float>(), p_device_.as<float>()));
    } else {
      GC_RETURN_IF_ERROR(gpu->MultiplyP(
          plan_, m_.as<float>(), q_device_.as<float>(), p_device_.as<float>()));
    }
    p_.resize(p_size());
    GC_RETURN_IF_ERROR(Download(p_device_.as<float>(), absl::MakeSpan(p_)));
    // A NaN or Inf in M reaches P (the CPU twin checks M itself; a finite M
    // whose products overflow is caught by the sum's check instead).
    if (!AllFinite(p_)) {
      return absl::InvalidArgumentError(
          "powersgd: the gradient plus its error feedback holds NaN or Inf; "
          "expected finite values");
    }
    return absl::OkStatus();
  }

  absl::Status AbsorbP(const std::vector<float>& p_sum) {
    absl::MutexLock lock(&codec_.mu_);
    GC_ASSIGN_OR_RETURN(PowerSgdGpu * gpu, codec_.Gpu());
    GC_RETURN_IF_ERROR(Upload(p_sum, p_device_.as<float>()));
    GC_RETURN_IF_ERROR(
        gpu->Orthonormalize(p_device_.as<float>(), plan_.rows, plan_.rank));
    GC_RETURN_IF_ERROR(gpu->MultiplyQ(
        plan_, m_.as<float>(), p_device_.as<float>(), q_device_.as<float>()));
    own_q_.resize(q_size());
    GC_RETURN_IF_ERROR(Download(q_device_.as<float>(), absl::MakeSpan(own_q_)));
    stage_ = Stage::kHaveP;
    return absl::OkStatus();
  }

  // The step's result is known: the state moves on (residual, warm start).
  absl::Status AbsorbQ(std::vector<float> q_sum, int world_size) {
    q_mean_ = std::move(q_sum);
    const float w = static_cast<float>(world_size);
    for (float& v : q_mean_) v /= w;
    {
      absl::MutexLock lock(&codec_.mu_);
      GC_ASSIGN_OR_RETURN(PowerSgdGpu * gpu, codec_.Gpu());
      GC_RETURN_IF_ERROR(Upload(q_mean_, q_device_.as<float>()));
      GC_RETURN_IF_ERROR(gpu->SubtractLowRank(
          plan_, p_device_.as<float>(), q_device_.as<float>(), m_.as<float>()));
      GC_RETURN_IF_ERROR(Download(
          m_.as<float>(), state_.Buffer(kPowerSgdErrorBuffer, grad_.numel())));
    }
    if (codec_.options().warm_start) {
      absl::Span<float> warm = state_.Buffer(kPowerSgdQBuffer, q_mean_.size());
      std::copy(q_mean_.begin(), q_mean_.end(), warm.begin());
    }
    stage_ = Stage::kDone;
    return absl::OkStatus();
  }

  // out = P_hat q^T, expanded on the GPU in M's buffer (free once the
  // residual is on the host).
  absl::Status Expand(const std::vector<float>& q, absl::Span<float> out) {
    absl::MutexLock lock(&codec_.mu_);
    GC_ASSIGN_OR_RETURN(PowerSgdGpu * gpu, codec_.Gpu());
    GC_RETURN_IF_ERROR(Upload(q, q_device_.as<float>()));
    GC_RETURN_IF_ERROR(gpu->Expand(plan_, p_device_.as<float>(),
                                   q_device_.as<float>(), m_.as<float>()));
    return Download(m_.as<float>(), out);
  }

  absl::Status CheckDone(absl::string_view call, absl::Span<float> out) const {
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

  static absl::Status OutOfOrder(absl::string_view call,
                                 absl::string_view why) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "powersgd session (GPU): %s called out of order: %s", call, why));
  }

  const CudaPowerSgdCodec& codec_;
  const PowerSgdPlan plan_;
  const TensorView grad_;
  TensorState& state_;
  const StepContext ctx_;
  Stage stage_ = Stage::kStart;
  DeviceBuffer m_;             // M = g + e, then the new residual, then outputs
  DeviceBuffer p_device_;      // P, then P_hat
  DeviceBuffer q_device_;      // Q, then M^T P_hat, then a Q to expand
  std::vector<float> p_;       // M Q, this worker's round-0 body
  std::vector<float> own_q_;   // M^T P_hat, this worker's round-1 body
  std::vector<float> q_mean_;  // sum of Q / W
};

absl::StatusOr<std::unique_ptr<CudaPowerSgdCodec>> CudaPowerSgdCodec::Create(
    const CodecParams& params) {
  GC_ASSIGN_OR_RETURN(std::unique_ptr<PowerSgdCodec> cpu,
                      PowerSgdCodec::Create(params));
  return std::unique_ptr<CudaPowerSgdCodec>(
      new CudaPowerSgdCodec(std::move(cpu)));
}

CudaPowerSgdCodec::CudaPowerSgdCodec(std::unique_ptr<PowerSgdCodec> cpu)
    : cpu_(std::move(cpu)) {}

absl::StatusOr<PowerSgdGpu*> CudaPowerSgdCodec::Gpu() const {
  if (gpu_ == nullptr) {
    GC_ASSIGN_OR_RETURN(gpu_, PowerSgdGpu::Create());
  }
  return gpu_.get();
}

absl::StatusOr<std::unique_ptr<CodecSession>> CudaPowerSgdCodec::Start(
    const TensorView& grad, TensorState& state, const StepContext& ctx) const {
  GC_RETURN_IF_ERROR(CudaDeviceAvailable());
  // The CPU twin's checks of the context and shape, and its session for
  // tensors sent dense (a copy of g: nothing for the GPU to do).
  GC_ASSIGN_OR_RETURN(std::unique_ptr<CodecSession> cpu_session,
                      cpu_->Start(grad, state, ctx));
  const PowerSgdPlan plan = PlanPowerSgd(options(), grad.shape);
  if (plan.dense()) return cpu_session;
  return std::unique_ptr<CodecSession>(
      std::make_unique<CudaPowerSgdSession>(*this, plan, grad, state, ctx));
}

}  // namespace gradcomp::codecs::cuda
