// GPU PowerSGD against its CPU twin (needs a GPU; skips without one). cuBLAS
// sums in another order than Eigen, so results are compared as relative
// Frobenius distances under kTolerance (docs/gpu.md, "PowerSGD"); where the
// arithmetic is exact (the first Q, dense plans, payload headers) bytes are
// compared. Inputs are drawn with fixed seeds.
#include "codecs/cuda/powersgd.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "codecs/codec.h"
#include "codecs/cpu/linalg.h"
#include "codecs/cpu/powersgd.h"
#include "codecs/cuda/device.h"
#include "codecs/cuda/gpu_test_util.h"
#include "codecs/params.h"
#include "codecs/state.h"
#include "codecs/testing/conformance.h"
#include "codecs/testing/random_inputs.h"
#include "codecs/wire.h"
#include "gtest/gtest.h"

namespace gradcomp::codecs::cuda {
namespace {

using Matrix = std::vector<float>;

// Relative Frobenius distance allowed between GPU and CPU results of a step
// (measured: see the "max distance" lines these tests print).
constexpr double kTolerance = 1e-4;

using testing::LowRank;
using testing::Normal;

double Norm(absl::Span<const float> a) {
  double s = 0;
  for (float x : a) s += static_cast<double>(x) * x;
  return std::sqrt(s);
}

// ||a - b|| / max(||b||, scale).
double Distance(absl::Span<const float> a, absl::Span<const float> b,
                double scale = 0) {
  EXPECT_EQ(a.size(), b.size());
  double s = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    s += d * d;
  }
  const double norm = std::max(Norm(b), scale);
  return norm > 0 ? std::sqrt(s) / norm : std::sqrt(s);
}

// The payload's bytes before its fp32 body: wire header and parameters.
absl::string_view Head(const Bytes& payload) {
  const absl::StatusOr<ParsedPayload> parsed = PeekPayload(payload);
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  return absl::string_view(payload).substr(
      0, payload.size() - (parsed.ok() ? parsed->body.size() : 0));
}

Matrix Body(const Bytes& payload) {
  const absl::StatusOr<ParsedPayload> parsed = PeekPayload(payload);
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  if (!parsed.ok()) return {};
  Matrix body(parsed->body.size() / sizeof(float));
  std::memcpy(body.data(), parsed->body.data(), body.size() * sizeof(float));
  return body;
}

// One step of a world whose rank r runs codecs[r] (CPU or GPU): sessions
// in lock step, each summed round handed to all.
testing::SimulatedStep RunStep(const std::vector<const Codec*>& codecs,
                               const std::vector<Matrix>& grads,
                               const std::vector<int64_t>& shape,
                               std::vector<TensorState>& states, int64_t step) {
  const int world = static_cast<int>(grads.size());
  std::vector<std::unique_ptr<CodecSession>> sessions;
  for (int r = 0; r < world; ++r) {
    StepContext ctx;
    ctx.seed = 99;
    ctx.tensor_id = 5;
    ctx.step = step;
    ctx.rank = r;
    ctx.world_size = world;
    absl::StatusOr<std::unique_ptr<CodecSession>> session =
        codecs[r]->Start(TensorView{grads[r], shape}, states[r], ctx);
    EXPECT_TRUE(session.ok()) << session.status();
    if (!session.ok()) return {};
    sessions.push_back(std::move(session).value());
  }
  testing::SimulatedStep result;
  for (int round = 0; round < 3; ++round) {
    std::vector<Bytes> payloads;
    for (int r = 0; r < world; ++r) {
      absl::StatusOr<std::optional<Round>> next = sessions[r]->NextRound();
      EXPECT_TRUE(next.ok()) << next.status();
      if (!next.ok()) return {};
      if (next->has_value()) payloads.push_back((*next)->payload);
    }
    if (payloads.empty()) break;
    EXPECT_EQ(payloads.size(), static_cast<size_t>(world));
    absl::StatusOr<std::vector<float>> sum = testing::SumDenseBodies(payloads);
    EXPECT_TRUE(sum.ok()) << sum.status();
    for (int r = 0; r < world; ++r) {
      RoundResult rr;
      rr.world_size = world;
      rr.sum = *sum;
      const absl::Status s = sessions[r]->Absorb(std::move(rr));
      EXPECT_TRUE(s.ok()) << s;
    }
    result.payloads.push_back(std::move(payloads));
  }
  for (int r = 0; r < world; ++r) {
    Matrix out(grads[r].size()), own(grads[r].size());
    EXPECT_TRUE(sessions[r]->Finish(absl::MakeSpan(out)).ok());
    EXPECT_TRUE(sessions[r]->DecodeOwn(absl::MakeSpan(own)).ok());
    result.out.push_back(std::move(out));
    result.own.push_back(std::move(own));
  }
  return result;
}

class CudaPowerSgdTest : public GpuTest {
 protected:
  static std::unique_ptr<PowerSgdCodec> Cpu(const CodecParams& params) {
    return PowerSgdCodec::Create(params).value();
  }
  static std::unique_ptr<CudaPowerSgdCodec> Gpu(const CodecParams& params) {
    return CudaPowerSgdCodec::Create(params).value();
  }
};

struct Shape {
  std::vector<int64_t> dims;
  int rank;
};

// Both backends, each with its own state, over several steps (warm start
// and error feedback carried): every round's body, the average, the own
// decode and the new residual agree; headers are the same bytes.
TEST_F(CudaPowerSgdTest, GpuMatchesCpuOverSteps) {
  const std::vector<Shape> shapes = {
      {{64, 48}, 1},
      {{64, 48}, 4},
      {{300, 20, 3}, 2},
      {{1000, 1000}, 4},
      {{512, 512, 3, 3}, 4},
      {{37, 2000}, 8},
      // Past the fused kernel's rank: FormM, then cuBLAS.
      {{200, 300}, 12},
  };
  constexpr int kWorld = 2;
  constexpr int kSteps = 3;
  double worst = 0;
  for (const Shape& shape : shapes) {
    const CodecParams params({{"rank", std::to_string(shape.rank)}});
    const auto cpu = Cpu(params);
    const auto gpu = Gpu(params);
    int64_t n = 1;
    for (int64_t d : shape.dims) n *= d;
    std::vector<TensorState> cpu_states(kWorld), gpu_states(kWorld);
    for (int step = 0; step < kSteps; ++step) {
      std::vector<Matrix> grads;
      for (int r = 0; r < kWorld; ++r)
        grads.push_back(Normal(n, 10 * step + r));
      const testing::SimulatedStep want =
          RunStep({cpu.get(), cpu.get()}, grads, shape.dims, cpu_states, step);
      const testing::SimulatedStep got =
          RunStep({gpu.get(), gpu.get()}, grads, shape.dims, gpu_states, step);
      ASSERT_EQ(got.payloads.size(), 2u);
      ASSERT_EQ(want.payloads.size(), 2u);
      const double scale = Norm(grads[0]);
      for (int round = 0; round < 2; ++round) {
        for (int r = 0; r < kWorld; ++r) {
          const Bytes& g = got.payloads[round][r];
          const Bytes& w = want.payloads[round][r];
          EXPECT_EQ(Head(g), Head(w)) << "round " << round;
          const double d = Distance(Body(g), Body(w));
          worst = std::max(worst, d);
          EXPECT_LT(d, kTolerance) << shape.dims[0] << " rank " << shape.rank
                                   << " step " << step << " round " << round;
        }
      }
      for (int r = 0; r < kWorld; ++r) {
        const double out = Distance(got.out[r], want.out[r]);
        const double own = Distance(got.own[r], want.own[r]);
        const double error =
            Distance(*gpu_states[r].Find(kPowerSgdErrorBuffer),
                     *cpu_states[r].Find(kPowerSgdErrorBuffer), scale);
        const double warm = Distance(*gpu_states[r].Find(kPowerSgdQBuffer),
                                     *cpu_states[r].Find(kPowerSgdQBuffer));
        worst = std::max({worst, out, own, error, warm});
        EXPECT_LT(out, kTolerance) << shape.dims[0] << " step " << step;
        EXPECT_LT(own, kTolerance) << shape.dims[0] << " step " << step;
        EXPECT_LT(error, kTolerance) << shape.dims[0] << " step " << step;
        EXPECT_LT(warm, kTolerance) << shape.dims[0] << " step " << step;
      }
    }
  }
  std::printf("GpuMatchesCpuOverSteps: max distance %.3g\n", worst);
}

// A world of CPU and GPU workers: each sums the other's payloads, and the
// result is the all-CPU world's.
TEST_F(CudaPowerSgdTest, MixedBackendsSumTogether) {
  const CodecParams params({{"rank", "4"}});
  const auto cpu = Cpu(params);
  const auto gpu = Gpu(params);
  const std::vector<int64_t> shape = {200, 150};
  std::vector<TensorState> mixed_states(3), cpu_states(3);
  double worst = 0;
  for (int step = 0; step < 3; ++step) {
    std::vector<Matrix> grads;
    for (int r = 0; r < 3; ++r)
      grads.push_back(Normal(200 * 150, 50 + 7 * step + r));
    const testing::SimulatedStep want = RunStep(
        {cpu.get(), cpu.get(), cpu.get()}, grads, shape, cpu_states, step);
    const testing::SimulatedStep got = RunStep(
        {cpu.get(), gpu.get(), cpu.get()}, grads, shape, mixed_states, step);
    ASSERT_EQ(got.out.size(), 3u);
    for (int r = 0; r < 3; ++r) {
      const double out = Distance(got.out[r], want.out[r]);
      const double error =
          Distance(*mixed_states[r].Find(kPowerSgdErrorBuffer),
                   *cpu_states[r].Find(kPowerSgdErrorBuffer), Norm(grads[r]));
      worst = std::max({worst, out, error});
      EXPECT_LT(out, kTolerance) << "rank " << r << " step " << step;
      EXPECT_LT(error, kTolerance) << "rank " << r << " step " << step;
      EXPECT_EQ(Head(got.payloads[0][r]), Head(want.payloads[0][r]));
    }
    // Every worker, CPU or GPU, computed the same average from the sums.
    EXPECT_LT(Distance(got.out[1], got.out[0]), kTolerance);
  }
  std::printf("MixedBackendsSumTogether: max distance %.3g\n", worst);
}

// With M = I, P = M Q = Q exactly in any summation order, so the round-0
// body shows the first step's Q itself: the CPU's Philox draw, bit for bit.
TEST_F(CudaPowerSgdTest, FirstQIsTheCpusPhiloxDraw) {
  const CodecParams params({{"rank", "4"}, {"min_compression_rate", "0"}});
  const auto cpu = Cpu(params);
  const auto gpu = Gpu(params);
  constexpr int64_t kN = 96;
  Matrix identity(kN * kN, 0.0f);
  for (int64_t i = 0; i < kN; ++i) identity[i * kN + i] = 1.0f;
  for (int64_t step : {0, 7}) {
    std::vector<TensorState> cpu_states(1), gpu_states(1);
    const testing::SimulatedStep want =
        RunStep({cpu.get()}, {identity}, {kN, kN}, cpu_states, step);
    const testing::SimulatedStep got =
        RunStep({gpu.get()}, {identity}, {kN, kN}, gpu_states, step);
    ASSERT_FALSE(got.payloads.empty());
    ASSERT_FALSE(want.payloads.empty());
    EXPECT_EQ(got.payloads[0][0], want.payloads[0][0]) << "step " << step;
  }
}

// The CPU's invariants hold on the GPU: a matrix of rank <= r comes back
// (single worker), output + new residual = input, zero gives zero.
TEST_F(CudaPowerSgdTest, Invariants) {
  const auto gpu = Gpu(CodecParams({{"rank", "4"}}));
  const std::vector<int64_t> shape = {120, 90};
  const Matrix low = LowRank(120, 90, 3, 4);
  std::vector<TensorState> states(1);
  const testing::SimulatedStep step =
      RunStep({gpu.get()}, {low}, shape, states, 0);
  ASSERT_EQ(step.out.size(), 1u);
  EXPECT_LT(Distance(step.out[0], low), 2e-5);  // the CPU test's bound
  const Matrix g = Normal(120 * 90, 8);
  std::vector<TensorState> fresh(1);
  const testing::SimulatedStep random =
      RunStep({gpu.get()}, {g}, shape, fresh, 0);
  ASSERT_EQ(random.out.size(), 1u);
  absl::Span<const float> error = *fresh[0].Find(kPowerSgdErrorBuffer);
  Matrix sum(g.size());
  for (size_t i = 0; i < g.size(); ++i) sum[i] = random.out[0][i] + error[i];
  EXPECT_LT(Distance(sum, g), 1e-5);
  const Matrix zero(120 * 90, 0.0f);
  std::vector<TensorState> zero_state(1);
  const testing::SimulatedStep zeros =
      RunStep({gpu.get()}, {zero}, shape, zero_state, 0);
  ASSERT_EQ(zeros.out.size(), 1u);
  EXPECT_EQ(zeros.out[0], zero);
  EXPECT_EQ(Norm(*zero_state[0].Find(kPowerSgdErrorBuffer)), 0.0);
}

// Tensors sent dense are the CPU twin's payloads exactly.
TEST_F(CudaPowerSgdTest, DensePlanIsTheCpus) {
  const CodecParams params;
  const auto cpu = Cpu(params);
  const auto gpu = Gpu(params);
  const Matrix g = Normal(500, 3);
  for (const std::vector<int64_t>& shape :
       std::vector<std::vector<int64_t>>{{500}, {4, 125}}) {
    std::vector<TensorState> a(1), b(1);
    const testing::SimulatedStep want = RunStep({cpu.get()}, {g}, shape, a, 0);
    const testing::SimulatedStep got = RunStep({gpu.get()}, {g}, shape, b, 0);
    ASSERT_EQ(got.payloads.size(), 1u);
    EXPECT_EQ(got.payloads, want.payloads);
    EXPECT_EQ(got.out, want.out);
  }
}

TEST_F(CudaPowerSgdTest, RejectsNonFiniteInputAndCallsOutOfOrder) {
  const auto gpu = Gpu(CodecParams({{"rank", "2"}}));
  const std::vector<int64_t> shape = {40, 30};
  Matrix g = Normal(1200, 2);
  g[77] = std::numeric_limits<float>::quiet_NaN();
  TensorState state;
  std::unique_ptr<CodecSession> session =
      gpu->Start(TensorView{g, shape}, state, StepContext{}).value();
  EXPECT_EQ(session->NextRound().status().code(),
            absl::StatusCode::kInvalidArgument);
  g[77] = 1.0f;
  session = gpu->Start(TensorView{g, shape}, state, StepContext{}).value();
  Matrix out(g.size());
  EXPECT_EQ(session->Finish(absl::MakeSpan(out)).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(session->NextRound().ok());
  RoundResult wrong;
  wrong.sum.assign(7, 0.0f);
  EXPECT_EQ(session->Absorb(std::move(wrong)).code(),
            absl::StatusCode::kInvalidArgument);
  RoundResult nan;
  nan.sum.assign(40 * 2, std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(session->Absorb(std::move(nan)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(state.buffers().size(), 0u);
}

// The one-pass kernel (M = g + e - P_old Q_old^T and P = M Q) against the
// same steps one by one (FormM, SubtractLowRank, MultiplyP).
TEST_F(CudaPowerSgdTest, FormMAndMultiplyMatchesStepByStep) {
  std::unique_ptr<PowerSgdGpu> gpu = PowerSgdGpu::Create().value();
  for (const PowerSgdPlan plan :
       {PowerSgdPlan{300, 257, 3}, PowerSgdPlan{64, 1000, 8},
        PowerSgdPlan{1, 40, 1}}) {
    const size_t n = plan.rows * plan.cols;
    const size_t p_size = plan.rows * plan.rank;
    const size_t q_size = plan.cols * plan.rank;
    const std::vector<Matrix> host = {
        Normal(n, 1),      Normal(n, 2),      Normal(p_size, 3),
        Normal(q_size, 4), Normal(q_size, 5),
    };
    std::vector<DeviceBuffer> d;
    for (const Matrix& h : host) {
      d.push_back(DeviceBuffer::Create(h.size() * sizeof(float)).value());
      ASSERT_EQ(cudaMemcpy(d.back().data(), h.data(), h.size() * sizeof(float),
                           cudaMemcpyHostToDevice),
                cudaSuccess);
    }
    const float* g = d[0].as<float>();
    const float* e = d[1].as<float>();
    const float* p_old = d[2].as<float>();
    const float* q_old = d[3].as<float>();
    const float* q = d[4].as<float>();
    for (bool factored : {false, true}) {
      DeviceBuffer m1 = DeviceBuffer::Create(n * sizeof(float)).value();
      DeviceBuffer m2 = DeviceBuffer::Create(n * sizeof(float)).value();
      DeviceBuffer p1 = DeviceBuffer::Create(p_size * sizeof(float)).value();
      DeviceBuffer p2 = DeviceBuffer::Create(p_size * sizeof(float)).value();
      ASSERT_TRUE(gpu->FormMAndMultiplyP(plan, g, e, factored ? p_old : nullptr,
                                         factored ? q_old : nullptr, q,
                                         m1.as<float>(), p1.as<float>())
                      .ok());
      ASSERT_TRUE(gpu->FormM(g, e, n, m2.as<float>()).ok());
      if (factored) {
        ASSERT_TRUE(
            gpu->SubtractLowRank(plan, p_old, q_old, m2.as<float>()).ok());
      }
      ASSERT_TRUE(gpu->MultiplyP(plan, m2.as<float>(), q, p2.as<float>()).ok());
      Matrix got_m(n), want_m(n), got_p(p_size), want_p(p_size);
      ASSERT_EQ(
          cudaMemcpy(got_m.data(), m1.data(), n * 4, cudaMemcpyDeviceToHost),
          cudaSuccess);
      ASSERT_EQ(
          cudaMemcpy(want_m.data(), m2.data(), n * 4, cudaMemcpyDeviceToHost),
          cudaSuccess);
      ASSERT_EQ(cudaMemcpy(got_p.data(), p1.data(), p_size * 4,
                           cudaMemcpyDeviceToHost),
                cudaSuccess);
      ASSERT_EQ(cudaMemcpy(want_p.data(), p2.data(), p_size * 4,
                           cudaMemcpyDeviceToHost),
                cudaSuccess);
      EXPECT_LT(Distance(got_m, want_m), 1e-6) << plan.rows << " " << factored;
      EXPECT_LT(Distance(got_p, want_p), 1e-5) << plan.rows << " " << factored;
    }
  }
}

// The device orthonormalisation against the CPU's, on a well-conditioned
// factor, a rank-deficient one and one with a zero column.
TEST_F(CudaPowerSgdTest, OrthonormalizeMatchesCpu) {
  std::unique_ptr<PowerSgdGpu> gpu = PowerSgdGpu::Create().value();
  constexpr size_t kRows = 3000, kCols = 6;
  std::vector<Matrix> cases = {Normal(kRows * kCols, 1),
                               LowRank(kRows, kCols, 3, 2),
                               Normal(kRows * kCols, 3)};
  for (size_t i = 0; i < kRows; ++i) cases[2][i * kCols + 4] = 0.0f;
  for (Matrix& a : cases) {
    Matrix want = a;
    OrthonormalizeColumns(absl::MakeSpan(want), kRows, kCols);
    DeviceBuffer d = DeviceBuffer::Create(a.size() * sizeof(float)).value();
    ASSERT_EQ(cudaMemcpy(d.data(), a.data(), a.size() * sizeof(float),
                         cudaMemcpyHostToDevice),
              cudaSuccess);
    ASSERT_TRUE(gpu->Orthonormalize(d.as<float>(), kRows, kCols).ok());
    Matrix got(a.size());
    ASSERT_EQ(cudaMemcpy(got.data(), d.data(), a.size() * sizeof(float),
                         cudaMemcpyDeviceToHost),
              cudaSuccess);
    double max_diff = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      max_diff = std::max(max_diff, std::fabs(static_cast<double>(got[i]) -
                                              static_cast<double>(want[i])));
    }
    EXPECT_LT(max_diff, 1e-6);
  }
}

}  // namespace
}  // namespace gradcomp::codecs::cuda
