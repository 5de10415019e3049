// One PowerSGD rank-r encode step on the GPU (codecs/cuda/powersgd.h
// PowerSgdGpu) beside the two cuBLAS GEMMs it needs, in the same run: the
// step is M = g + e, P = M Q, orthonormalise P, Q = M^T P_hat and the error
// feedback e = M - P_hat Q^T, everything in device memory (no collective,
// no host copies); the baseline is P = M Q and Q = M^T P alone on a
// materialised M. Also each part of the step, and a device-to-device copy
// of M for the memory bandwidth. CUDA events, 3 warm-up runs, mean of 20.
// One JSON object per line on stdout, like bench/cuda_codec_benchmark.cc;
// bench/cuda_powersgd_torch.py times PyTorch's formulation the same way.
//
//   cuda_powersgd_benchmark [rank]    (default 4)
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "base/status_macros.h"
#include "bench/cuda_timer.h"
#include "codecs/cpu/linalg.h"
#include "codecs/cpu/powersgd.h"
#include "codecs/cuda/device.h"
#include "codecs/cuda/powersgd.h"
#include "codecs/random.h"

namespace gradcomp::codecs::cuda {
namespace {

constexpr int kWarmup = 3;
constexpr int kReps = 20;

void Check(const absl::Status& status, const char* what) {
  if (!status.ok()) {
    std::fprintf(stderr, "cuda_powersgd_benchmark: %s: %s\n", what,
                 std::string(status.message()).c_str());
    std::exit(1);
  }
}

void Check(cudaError_t error, const char* what) {
  Check(CudaStatus(error, what), what);
}

// Mean milliseconds of `launch` over kReps, timed with CUDA events.
double TimeMs(const std::function<absl::Status()>& launch) {
  const absl::StatusOr<double> ms = bench::TimeCudaMs(launch, kWarmup, kReps);
  Check(ms.status(), "timing");
  return *ms;
}

DeviceBuffer Alloc(size_t floats) {
  absl::StatusOr<DeviceBuffer> buffer =
      DeviceBuffer::Create(floats * sizeof(float));
  Check(buffer.status(), "cudaMalloc");
  return std::move(buffer).value();
}

void Upload(const std::vector<float>& host, const DeviceBuffer& device) {
  Check(cudaMemcpy(device.data(), host.data(), host.size() * sizeof(float),
                   cudaMemcpyHostToDevice),
        "upload");
}

void Report(const char* op, const PowerSgdPlan& plan, double ms,
            double gemms_ms) {
  std::printf(
      "{\"impl\": \"gradcomp-cuda\", \"op\": \"%s\", \"rows\": %lld, "
      "\"cols\": %lld, \"rank\": %lld, \"n\": %lld, \"ms\": %.4f, "
      "\"ratio_to_gemms\": %.3f}\n",
      op, static_cast<long long>(plan.rows), static_cast<long long>(plan.cols),
      static_cast<long long>(plan.rank),
      static_cast<long long>(plan.rows * plan.cols), ms, ms / gemms_ms);
  std::fflush(stdout);
}

void Run(PowerSgdGpu& gpu, int64_t rows, int64_t cols, int64_t rank) {
  const PowerSgdPlan plan{rows, cols, rank};
  const size_t n = static_cast<size_t>(rows * cols);
  std::vector<float> host(n);
  std::mt19937 gen(42);
  std::normal_distribution<float> dist(0.0f, 0.01f);
  for (float& x : host) x = dist(gen);
  DeviceBuffer g = Alloc(n), e = Alloc(n), m = Alloc(n);
  DeviceBuffer q0 = Alloc(cols * rank), q = Alloc(cols * rank),
               p = Alloc(rows * rank);
  Upload(host, g);
  Upload(host, m);
  Check(cudaMemset(e.data(), 0, n * sizeof(float)), "cudaMemset");
  // The first step's Q, as the codec draws it.
  std::vector<float> q_host(cols * rank);
  FillGaussian(PhiloxStream(1, 2, 0, 0), 0, absl::MakeSpan(q_host));
  OrthonormalizeColumns(absl::MakeSpan(q_host), cols, rank);
  Upload(q_host, q0);

  const double copy_ms = TimeMs([&] {
    return CudaStatus(cudaMemcpyAsync(m.data(), g.data(), n * sizeof(float),
                                      cudaMemcpyDeviceToDevice, nullptr),
                      "copy");
  });
  const double gemms_ms = TimeMs([&]() -> absl::Status {
    GC_RETURN_IF_ERROR(
        gpu.MultiplyP(plan, m.as<float>(), q0.as<float>(), p.as<float>()));
    return gpu.MultiplyQ(plan, m.as<float>(), p.as<float>(), q.as<float>());
  });
  Report("copy_m", plan, copy_ms, gemms_ms);
  Report("two_gemms", plan, gemms_ms, gemms_ms);
  Report("gemm_p", plan, TimeMs([&] {
           return gpu.MultiplyP(plan, m.as<float>(), q0.as<float>(),
                                p.as<float>());
         }),
         gemms_ms);
  Report("gemm_q", plan, TimeMs([&] {
           return gpu.MultiplyQ(plan, m.as<float>(), p.as<float>(),
                                q.as<float>());
         }),
         gemms_ms);
  Report("orthonormalize_p", plan,
         TimeMs([&] { return gpu.Orthonormalize(p.as<float>(), rows, rank); }),
         gemms_ms);
  Report("form_m", plan, TimeMs([&] {
           return gpu.FormM(g.as<float>(), e.as<float>(), n, m.as<float>());
         }),
         gemms_ms);
  Report("error_feedback", plan, TimeMs([&] {
           return gpu.SubtractLowRank(plan, p.as<float>(), q.as<float>(),
                                      m.as<float>());
         }),
         gemms_ms);
  // The codec's step, the residual kept in `e`: one pass forms M = g + e
  // in e's buffer and P = M Q; M becomes the new residual in place.
  Report("encode_step", plan, TimeMs([&]() -> absl::Status {
           GC_RETURN_IF_ERROR(gpu.FormMAndMultiplyP(
               plan, g.as<float>(), e.as<float>(), nullptr, nullptr,
               q0.as<float>(), e.as<float>(), p.as<float>()));
           GC_RETURN_IF_ERROR(gpu.Orthonormalize(p.as<float>(), rows, rank));
           GC_RETURN_IF_ERROR(gpu.MultiplyQ(plan, e.as<float>(), p.as<float>(),
                                            q.as<float>()));
           return gpu.SubtractLowRank(plan, p.as<float>(), q.as<float>(),
                                      e.as<float>());
         }),
         gemms_ms);
  // The same with M formed by its own kernel and P by cuBLAS.
  Report("encode_step_unfused", plan, TimeMs([&]() -> absl::Status {
           GC_RETURN_IF_ERROR(
               gpu.FormM(g.as<float>(), e.as<float>(), n, e.as<float>()));
           GC_RETURN_IF_ERROR(gpu.MultiplyP(plan, e.as<float>(), q0.as<float>(),
                                            p.as<float>()));
           GC_RETURN_IF_ERROR(gpu.Orthonormalize(p.as<float>(), rows, rank));
           GC_RETURN_IF_ERROR(gpu.MultiplyQ(plan, e.as<float>(), p.as<float>(),
                                            q.as<float>()));
           return gpu.SubtractLowRank(plan, p.as<float>(), q.as<float>(),
                                      e.as<float>());
         }),
         gemms_ms);
  // The residual in factored form: the buffer keeps M, and the step's
  // P_hat and Q are subtracted from it while the next step's M is formed
  // (the same arithmetic, one write of M per step instead of two passes).
  DeviceBuffer p_other = Alloc(rows * rank);
  float* p_new = p.as<float>();
  float* p_old = p_other.as<float>();
  Check(cudaMemset(p_old, 0, rows * rank * sizeof(float)), "cudaMemset");
  Check(cudaMemset(q.data(), 0, cols * rank * sizeof(float)), "cudaMemset");
  Report("encode_step_factored_residual", plan, TimeMs([&]() -> absl::Status {
           GC_RETURN_IF_ERROR(gpu.FormMAndMultiplyP(
               plan, g.as<float>(), e.as<float>(), p_old, q.as<float>(),
               q0.as<float>(), e.as<float>(), p_new));
           GC_RETURN_IF_ERROR(gpu.Orthonormalize(p_new, rows, rank));
           GC_RETURN_IF_ERROR(
               gpu.MultiplyQ(plan, e.as<float>(), p_new, q.as<float>()));
           std::swap(p_new, p_old);
           return absl::OkStatus();
         }),
         gemms_ms);
  // The step without error feedback (M given): the products and the
  // orthonormalisation.
  Report(
      "encode_step_no_error_feedback", plan, TimeMs([&]() -> absl::Status {
        GC_RETURN_IF_ERROR(
            gpu.MultiplyP(plan, m.as<float>(), q0.as<float>(), p.as<float>()));
        GC_RETURN_IF_ERROR(gpu.Orthonormalize(p.as<float>(), rows, rank));
        return gpu.MultiplyQ(plan, m.as<float>(), p.as<float>(), q.as<float>());
      }),
      gemms_ms);
}

}  // namespace
}  // namespace gradcomp::codecs::cuda

int main(int argc, char** argv) {
  using gradcomp::codecs::cuda::CudaDeviceAvailable;
  using gradcomp::codecs::cuda::PowerSgdGpu;
  const absl::Status gpu_status = CudaDeviceAvailable();
  if (!gpu_status.ok()) {
    std::fprintf(stderr, "cuda_powersgd_benchmark: %s\n",
                 std::string(gpu_status.message()).c_str());
    return 2;
  }
  const int64_t rank = argc > 1 ? std::strtoll(argv[1], nullptr, 10) : 4;
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
    std::printf("{\"impl\": \"gradcomp-cuda\", \"device\": \"%s\"}\n",
                prop.name);
  }
  absl::StatusOr<std::unique_ptr<PowerSgdGpu>> gpu = PowerSgdGpu::Create();
  gradcomp::codecs::cuda::Check(gpu.status(), "PowerSgdGpu::Create");
  // 25M and 100M floats, and ResNet-50's largest 3x3 convolution
  // (512 x 512 x 3 x 3, seen as 512 x 4608) and its classifier (1000 x 2048).
  const int64_t shapes[][2] = {
      {5000, 5000}, {10000, 10000}, {512, 4608}, {1000, 2048}};
  for (const auto& shape : shapes) {
    gradcomp::codecs::cuda::Run(**gpu, shape[0], shape[1], rank);
  }
  return 0;
}
