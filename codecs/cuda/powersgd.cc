#include "codecs/cuda/powersgd.h"

#include <cublas_v2.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "codecs/cuda/nonfinite.h"
#include "codecs/cuda/powersgd_kernels.h"

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

bool AllFinite(absl::Span<const float> v) {
  return std::all_of(v.begin(), v.end(),
                     [](float x) { return std::isfinite(x); });
}

// The number of NaN and Inf among the n values at device `x`.
absl::StatusOr<unsigned long long> CountNonfinite(const float* x, size_t n) {
  GC_ASSIGN_OR_RETURN(DeviceBuffer count,
                      DeviceBuffer::Create(sizeof(unsigned long long)));
  GC_CUDA_RETURN_IF_ERROR(
      cudaMemset(count.data(), 0, sizeof(unsigned long long)));
  GC_CUDA_RETURN_IF_ERROR(
      LaunchCountNonfinite(x, n, count.as<unsigned long long>(), nullptr));
  unsigned long long host = 0;
  GC_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(&host, count.data(), sizeof(host), cudaMemcpyDeviceToHost));
  return host;
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

// One tensor, one step: the CPU twin's bookkeeping (PowerSgdSession) with
// M, P and Q on the GPU. M is formed once, in device memory, and becomes
// the residual in place at the end of the step.
class CudaPowerSgdSession : public PowerSgdSession {
 public:
  CudaPowerSgdSession(const CudaPowerSgdCodec& codec, const PowerSgdPlan& plan,
                      const TensorView& grad, TensorState& state,
                      const StepContext& ctx)
      : PowerSgdSession(codec.options(), plan, grad, state, ctx,
                        /*backend=*/"GPU"),
        codec_(codec) {}

 private:
  size_t p_size() const {
    return static_cast<size_t>(plan().rows * plan().rank);
  }
  size_t q_size() const {
    return static_cast<size_t>(plan().cols * plan().rank);
  }

  absl::StatusOr<std::vector<float>> MultiplyP(
      const std::vector<float>& q) override {
    const size_t n = grad().numel();
    absl::MutexLock lock(&codec_.mu_);
    GC_ASSIGN_OR_RETURN(PowerSgdGpu * gpu, codec_.Gpu());
    GC_ASSIGN_OR_RETURN(m_, DeviceBuffer::Create(n * sizeof(float)));
    GC_ASSIGN_OR_RETURN(p_device_,
                        DeviceBuffer::Create(p_size() * sizeof(float)));
    GC_ASSIGN_OR_RETURN(q_device_,
                        DeviceBuffer::Create(q_size() * sizeof(float)));
    GC_RETURN_IF_ERROR(CopyToDevice(grad().values, m_.as<float>()));
    GC_RETURN_IF_ERROR(CopyToDevice(q, q_device_.as<float>()));
    if (const float* error = FindResidual(); error != nullptr) {
      GC_ASSIGN_OR_RETURN(DeviceBuffer e,
                          DeviceBuffer::Create(n * sizeof(float)));
      GC_RETURN_IF_ERROR(
          CopyToDevice(absl::MakeConstSpan(error, n), e.as<float>()));
      GC_RETURN_IF_ERROR(gpu->FormMAndMultiplyP(
          plan(), m_.as<float>(), e.as<float>(), nullptr, nullptr,
          q_device_.as<float>(), m_.as<float>(), p_device_.as<float>()));
    } else {
      GC_RETURN_IF_ERROR(gpu->MultiplyP(plan(), m_.as<float>(),
                                        q_device_.as<float>(),
                                        p_device_.as<float>()));
    }
    std::vector<float> p(p_size());
    GC_RETURN_IF_ERROR(CopyToHost(p_device_.as<float>(), absl::MakeSpan(p)));
    // A NaN or Inf in M reaches P (the CPU twin checks M itself; a finite M
    // whose products overflow is caught by the sum's check instead).
    if (!AllFinite(p)) return NonFiniteInput();
    return p;
  }

  absl::StatusOr<std::vector<float>> MultiplyQ(
      std::vector<float> p_sum) override {
    absl::MutexLock lock(&codec_.mu_);
    GC_ASSIGN_OR_RETURN(PowerSgdGpu * gpu, codec_.Gpu());
    GC_RETURN_IF_ERROR(CopyToDevice(p_sum, p_device_.as<float>()));
    GC_RETURN_IF_ERROR(
        gpu->Orthonormalize(p_device_.as<float>(), plan().rows, plan().rank));
    GC_RETURN_IF_ERROR(gpu->MultiplyQ(
        plan(), m_.as<float>(), p_device_.as<float>(), q_device_.as<float>()));
    std::vector<float> own_q(q_size());
    GC_RETURN_IF_ERROR(
        CopyToHost(q_device_.as<float>(), absl::MakeSpan(own_q)));
    return own_q;
  }

  // The new residual is formed in M's device buffer, so the host's stays as
  // it was until it is known to be finite.
  absl::Status UpdateResidual(const std::vector<float>& q_mean,
                              absl::Span<float> error) override {
    absl::MutexLock lock(&codec_.mu_);
    GC_ASSIGN_OR_RETURN(PowerSgdGpu * gpu, codec_.Gpu());
    GC_RETURN_IF_ERROR(CopyToDevice(q_mean, q_device_.as<float>()));
    GC_RETURN_IF_ERROR(gpu->SubtractLowRank(
        plan(), p_device_.as<float>(), q_device_.as<float>(), m_.as<float>()));
    GC_ASSIGN_OR_RETURN(const unsigned long long nonfinite,
                        CountNonfinite(m_.as<float>(), grad().numel()));
    if (nonfinite > 0) return SummedFactorOverflow();
    return CopyToHost(m_.as<float>(), error);
  }

  // out = P_hat q^T, expanded on the GPU in M's buffer (free once the
  // residual is on the host).
  absl::Status Expand(const std::vector<float>& q,
                      absl::Span<float> out) override {
    absl::MutexLock lock(&codec_.mu_);
    GC_ASSIGN_OR_RETURN(PowerSgdGpu * gpu, codec_.Gpu());
    GC_RETURN_IF_ERROR(CopyToDevice(q, q_device_.as<float>()));
    GC_RETURN_IF_ERROR(gpu->Expand(plan(), p_device_.as<float>(),
                                   q_device_.as<float>(), m_.as<float>()));
    return CopyToHost(m_.as<float>(), out);
  }

  const CudaPowerSgdCodec& codec_;
  DeviceBuffer m_;         // M = g + e, then the new residual, then outputs
  DeviceBuffer p_device_;  // P, then P_hat
  DeviceBuffer q_device_;  // Q, then M^T P_hat, then a Q to expand
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
