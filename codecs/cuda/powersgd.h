// `powersgd` on the GPU: the twin of codecs/cpu/powersgd.h (same parameters,
// CodecInfo, rounds, payloads and state buffers), with the three products
// of a step (P = M Q, Q = M^T P_hat, e = M - P_hat Q^T) as cuBLAS SGEMMs and
// P's orthonormalisation as one kernel. A step's payloads sum with the CPU
// twin's: workers may mix backends (docs/gpu.md, "PowerSGD").
//
//   GC_ASSIGN_OR_RETURN(std::unique_ptr<CudaPowerSgdCodec> codec,
//                       CudaPowerSgdCodec::Create(CodecParams({{"rank",
//                       "4"}})));
//   GC_ASSIGN_OR_RETURN(auto session, codec->Start(grad, state, ctx));
//
// It is not a CudaCodec (cuda_codec.h: single-round codecs), so
// CreateCudaCodec does not make it; CudaPowerSgdCodec::Create does.
//
// The state stays where the CPU twin keeps it (TensorState, host memory):
// a session copies g and the residual to the device, and the new residual
// back when the step ends. PowerSgdGpu is the device-side step alone, for
// callers whose gradient and residual already live on the GPU (and for
// bench/cuda_powersgd_benchmark.cc).
//
// Arithmetic: fp32 cuBLAS products (CUBLAS_PEDANTIC_MATH: no TF32, no
// reduced-precision reductions) in cuBLAS's summation order, so results
// agree with the CPU's to fp32 rounding, not bit for bit: relative Frobenius
// distances up to 2.5e-6 over three steps on the tests' matrices (H100; the
// tests allow 1e-4). The first step's Q (Philox normals, orthonormalised)
// is computed on the host by the CPU twin's own functions, so it is the
// CPU's bit for bit.
#ifndef GRADCOMP_CODECS_CUDA_POWERSGD_H_
#define GRADCOMP_CODECS_CUDA_POWERSGD_H_

#include <cstddef>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "codecs/codec.h"
#include "codecs/cpu/powersgd.h"
#include "codecs/cuda/device.h"
#include "codecs/params.h"

namespace gradcomp::codecs::cuda {

// One step's linear algebra on the GPU, on the default stream, for row-major
// fp32 matrices in device memory: M is plan.rows x plan.cols, P and P_hat
// rows x rank, Q cols x rank. Calls are asynchronous unless they say
// otherwise. Not thread-safe (one cuBLAS handle, one scratch buffer).
class PowerSgdGpu {
 public:
  // Unavailable without a usable GPU.
  static absl::StatusOr<std::unique_ptr<PowerSgdGpu>> Create();
  ~PowerSgdGpu();
  PowerSgdGpu(const PowerSgdGpu&) = delete;
  PowerSgdGpu& operator=(const PowerSgdGpu&) = delete;

  // m = g + e (n values; `m` may be `g` or `e`).
  absl::Status FormM(const float* g, const float* e, size_t n, float* m);
  // m = g + e - p_old q_old^T (the last term only when p_old is given: a
  // residual kept in factored form), then p = m q; `m` may be `g` or `e`.
  // One pass over g, e and m for rank <= 8 (a kernel), else FormM,
  // SubtractLowRank and MultiplyP.
  absl::Status FormMAndMultiplyP(const PowerSgdPlan& plan, const float* g,
                                 const float* e, const float* p_old,
                                 const float* q_old, const float* q, float* m,
                                 float* p);
  // p = m q.
  absl::Status MultiplyP(const PowerSgdPlan& plan, const float* m,
                         const float* q, float* p);
  // Orthonormalises the rows x cols matrix `a` in place
  // (OrthonormalizeColumns' algorithm, codecs/cpu/linalg.h).
  absl::Status Orthonormalize(float* a, size_t rows, size_t cols);
  // q = m^T p_hat.
  absl::Status MultiplyQ(const PowerSgdPlan& plan, const float* m,
                         const float* p_hat, float* q);
  // m -= p_hat q^T: M becomes the error feedback residual.
  absl::Status SubtractLowRank(const PowerSgdPlan& plan, const float* p_hat,
                               const float* q, float* m);
  // out = p_hat q^T.
  absl::Status Expand(const PowerSgdPlan& plan, const float* p_hat,
                      const float* q, float* out);

 private:
  struct Handle;
  explicit PowerSgdGpu(Handle* handle);

  // c (m x n, column-major) = alpha op(a) op(b) + beta c, op(x) = x or x^T.
  absl::Status Gemm(bool transpose_a, bool transpose_b, size_t m, size_t n,
                    size_t k, float alpha, const float* a, size_t lda,
                    const float* b, size_t ldb, float beta, float* c,
                    size_t ldc);

  Handle* handle_;
  DeviceBuffer scratch_;  // Orthonormalize's doubles, grown as needed
};

class CudaPowerSgdCodec : public Codec {
 public:
  // The CPU twin's parameters, checked as it checks them.
  static absl::StatusOr<std::unique_ptr<CudaPowerSgdCodec>> Create(
      const CodecParams& params);

  const CodecInfo& info() const override { return cpu_->info(); }
  const PowerSgdOptions& options() const { return cpu_->options(); }

  // As PowerSgdCodec::Start, on the GPU. Unavailable without a usable GPU
  // (the state is then untouched); the caller uses the CPU twin. Sessions
  // of one codec share one PowerSgdGpu and take turns on it.
  absl::StatusOr<std::unique_ptr<CodecSession>> Start(
      const TensorView& grad, TensorState& state,
      const StepContext& ctx) const override;

 private:
  explicit CudaPowerSgdCodec(std::unique_ptr<PowerSgdCodec> cpu);

  friend class CudaPowerSgdSession;
  // The shared PowerSgdGpu, made on first use; called with mu_ held.
  absl::StatusOr<PowerSgdGpu*> Gpu() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::unique_ptr<PowerSgdCodec> cpu_;
  mutable absl::Mutex mu_;
  mutable std::unique_ptr<PowerSgdGpu> gpu_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradcomp::codecs::cuda

#endif  // GRADCOMP_CODECS_CUDA_POWERSGD_H_
