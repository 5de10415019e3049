// Every rank must produce the same bytes whatever its core count
// (docs/codecs.md): a codec whose CPU kernel splits its tensor over threads
// (ParallelFor) must give the same payloads and the same averages with 1
// thread as with several. The tensor is large enough for several parts and
// not a multiple of any part's alignment, so part boundaries fall inside
// buckets' worth of work, and two steps cover state carried between them.
// (polar and PowerSGD have their own thread tests beside their kernels.)
#include <cstdint>
#include <map>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "codecs/builtin.h"
#include "codecs/cpu/parallel.h"
#include "codecs/params.h"
#include "codecs/state.h"
#include "codecs/testing/conformance.h"
#include "gtest/gtest.h"

namespace gradcomp::codecs {
namespace {

struct Case {
  std::string codec;
  std::map<std::string, std::string> params;
};

// 3 * (2^20 + 5) values: three parts of the usual 2^20 minimum.
constexpr int64_t kRows = 3, kCols = (int64_t{1} << 20) + 5;
constexpr int kWorld = 2;

std::vector<float> Gaussian(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal;
  std::vector<float> x(n);
  for (float& v : x) v = normal(gen);
  return x;
}

// Payloads and outputs of two steps of kWorld ranks, run with `threads`.
struct Steps {
  std::vector<std::vector<Bytes>> payloads;  // [step and round][rank]
  std::vector<std::vector<float>> outputs;   // [step * kWorld + rank]
};

Steps RunWith(const Codec& codec, int threads) {
  ScopedParallelThreads forced(threads);
  const int64_t shape[] = {kRows, kCols};
  std::vector<TensorState> states(kWorld);
  Steps run;
  for (int64_t step = 0; step < 2; ++step) {
    std::vector<std::vector<float>> grads;
    for (int r = 0; r < kWorld; ++r) {
      grads.push_back(Gaussian(kRows * kCols, 10 * step + r + 1));
    }
    StepContext ctx;
    ctx.seed = 7;
    ctx.step = step;
    absl::StatusOr<testing::SimulatedStep> simulated =
        testing::SimulateStep(codec, grads, shape, states, ctx);
    EXPECT_TRUE(simulated.ok()) << simulated.status();
    if (!simulated.ok()) return run;
    for (auto& round : simulated->payloads) run.payloads.push_back(round);
    for (auto& out : simulated->out) run.outputs.push_back(out);
  }
  return run;
}

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.codec;
  for (const auto& [key, value] : c.params) *os << " " << key << "=" << value;
}

class ThreadCountTest : public ::testing::TestWithParam<Case> {};

TEST_P(ThreadCountTest, SameBytesAndAveragesWithAnyNumberOfThreads) {
  absl::StatusOr<std::unique_ptr<Codec>> codec =
      BuiltinCodecs().Create(GetParam().codec, CodecParams(GetParam().params));
  ASSERT_TRUE(codec.ok()) << codec.status();
  const Steps one = RunWith(**codec, 1);
  ASSERT_FALSE(one.payloads.empty());
  for (int threads : {2, 3, 8}) {
    const Steps many = RunWith(**codec, threads);
    ASSERT_EQ(many.payloads.size(), one.payloads.size()) << threads;
    for (size_t i = 0; i < one.payloads.size(); ++i) {
      for (int r = 0; r < kWorld; ++r) {
        EXPECT_TRUE(many.payloads[i][r] == one.payloads[i][r])
            << threads << " threads: round " << i << " rank " << r;
      }
    }
    ASSERT_EQ(many.outputs.size(), one.outputs.size());
    for (size_t i = 0; i < one.outputs.size(); ++i) {
      EXPECT_TRUE(many.outputs[i] == one.outputs[i])
          << threads << " threads: output " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    ParallelKernels, ThreadCountTest,
    ::testing::Values(
        Case{"fp16", {}}, Case{"bf16", {}}, Case{"topk", {{"ratio", "0.01"}}},
        Case{"topk", {{"ratio", "0.01"}, {"sample", "1"}}}, Case{"qsgd", {}},
        Case{"threshold", {}}, Case{"terngrad", {}},
        Case{"int8", {{"stochastic", "true"}}}, Case{"signsgd", {}},
        Case{"efsign", {}}, Case{"signum", {}}, Case{"onebit", {}}),
    [](const ::testing::TestParamInfo<Case>& info) {
      std::string name = info.param.codec;
      for (const auto& [key, value] : info.param.params) {
        name += "_" + key;
      }
      return name;
    });

}  // namespace
}  // namespace gradcomp::codecs
