// GPU top-k selection against codecs/cpu/select.h SelectTopK: the same
// indices, threshold, passes and sample size for the same input, k, sample
// fraction and stream. Needs a GPU; skips (never passes) without one.
#include "codecs/cuda/select.h"

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "codecs/cpu/select.h"
#include "codecs/cuda/device.h"
#include "codecs/cuda/gpu_test_util.h"
#include "codecs/random.h"
#include "codecs/testing/random_inputs.h"
#include "gtest/gtest.h"

namespace gradcomp::codecs::cuda {
namespace {

using testing::Normal;

class SelectTest : public GpuTest {
 protected:
  void ExpectSameSelection(const std::vector<float>& x, size_t k, double sample,
                           uint64_t step) {
    const PhiloxStream rng(/*seed=*/1234, /*tensor_id=*/7, step,
                           /*round=*/0);
    const TopKSelection cpu = SelectTopK(x, k, sample, rng);
    absl::StatusOr<DeviceBuffer> device =
        DeviceBuffer::Create(x.size() * sizeof(float));
    ASSERT_TRUE(device.ok()) << device.status();
    if (!x.empty()) {
      ASSERT_EQ(cudaMemcpy(device->data(), x.data(), x.size() * sizeof(float),
                           cudaMemcpyHostToDevice),
                cudaSuccess);
    }
    absl::StatusOr<TopKSelection> gpu =
        SelectTopKDevice(device->as<float>(), x.size(), k, sample, rng);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    const std::string where =
        "n=" + std::to_string(x.size()) + " k=" + std::to_string(k) +
        " sample=" + std::to_string(sample) + " step=" + std::to_string(step);
    EXPECT_EQ(gpu->sample_size, cpu.sample_size) << where;
    EXPECT_EQ(gpu->passes, cpu.passes) << where;
    uint32_t a, b;
    std::memcpy(&a, &cpu.threshold, 4);
    std::memcpy(&b, &gpu->threshold, 4);
    EXPECT_EQ(b, a) << where;
    ASSERT_EQ(gpu->indices.size(), cpu.indices.size()) << where;
    EXPECT_TRUE(gpu->indices == cpu.indices) << where;
  }
};

const size_t kSizes[] = {0, 1, 7, 1000, 4099, 100003, (size_t{1} << 20) + 3};

TEST_F(SelectTest, MatchesCpuOnNormalData) {
  for (size_t n : kSizes) {
    for (double ratio : {0.001, 0.01, 0.1, 0.5, 1.0}) {
      const size_t k =
          static_cast<size_t>(std::ceil(ratio * static_cast<double>(n)));
      for (double sample : {0.001, 0.01, 1.0}) {
        for (uint64_t step : {0, 1, 2}) {
          ExpectSameSelection(Normal(n, 40 + step), k, sample, step);
        }
      }
    }
  }
}

TEST_F(SelectTest, MatchesCpuWithTiesZerosAndNonFinite) {
  // Few distinct magnitudes (ties broken by index in the trim), a tensor
  // mostly zero (fewer nonzero entries than k: passes down to the smallest
  // key), and NaN / Inf, which sort above every finite magnitude.
  const size_t n = 200003;
  std::vector<float> ties(n), sparse(n, 0.0f), nonfinite = Normal(n, 5);
  std::mt19937 gen(3);
  for (float& x : ties) x = static_cast<float>(static_cast<int>(gen() % 7) - 3);
  for (size_t i = 0; i < n; i += 997) sparse[i] = (i % 2 ? -1.0f : 1.0f) * i;
  for (size_t i = 0; i < n; i += 10007) {
    nonfinite[i] = i % 2 ? std::numeric_limits<float>::quiet_NaN()
                         : -std::numeric_limits<float>::infinity();
  }
  for (const std::vector<float>* x : {&ties, &sparse, &nonfinite}) {
    for (size_t k : {size_t{1}, size_t{100}, size_t{2000}, n / 3}) {
      for (double sample : {0.001, 0.01, 1.0}) {
        ExpectSameSelection(*x, k, sample, 3);
      }
    }
  }
}

TEST_F(SelectTest, MatchesCpuOnHeavyTails) {
  // A few huge values push the sampled threshold too high: the CPU lowers it
  // and filters again; the GPU must take the same passes.
  std::vector<float> x = Normal(500009, 8);
  for (size_t i = 0; i < x.size(); i += 50001) x[i] = 1e30f;
  for (size_t k : {size_t{5}, size_t{50}, size_t{5000}}) {
    ExpectSameSelection(x, k, 0.001, 4);
  }
}

TEST_F(SelectTest, MatchesCpuAcrossSizesAndThreads) {
  // The device memory is kept per thread and grows: a large selection, a
  // small one after it, a pass finding far more than its first buffer holds
  // (ties), and the large one again; on two threads at once.
  const std::vector<float> large = Normal(3000017, 21);
  const std::vector<float> small = Normal(5003, 22);
  std::vector<float> ties(400009);
  std::mt19937 gen(23);
  for (float& x : ties) x = static_cast<float>(static_cast<int>(gen() % 3));
  auto run = [&](uint64_t step) {
    ExpectSameSelection(large, 3000, 0.01, step);
    ExpectSameSelection(small, 5, 0.01, step);
    ExpectSameSelection(ties, 10, 0.01, step);
    ExpectSameSelection(large, 3000, 0.01, step + 1);
  };
  std::thread first(run, 10);
  std::thread second(run, 20);
  first.join();
  second.join();
}

}  // namespace
}  // namespace gradcomp::codecs::cuda
