// Where no GPU answers (CPU-only builds, and CUDA builds on CI): no codec has
// a twin, device copies are Unavailable, and a reduce of a device tensor
// fails with that reason instead of touching the memory. The GPU side is
// device_reduce_gpu_test's.
#include "service/engine/device_codecs.h"

#include <memory>
#include <string>

#include "codecs/builtin.h"
#include "codecs/state.h"
#include "gtest/gtest.h"
#include "service/collective/local_collective.h"
#include "service/engine/engine.h"
#include "service/metrics/metrics.h"
#include "service/metrics/metrics_testing.h"

namespace gradcomp::service {
namespace {

class NoGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CreateDeviceCodec({"none", {}}).ok()) {
      GTEST_SKIP() << "a GPU answers here: device_reduce_gpu_test covers it";
    }
  }
};

TEST_F(NoGpuTest, NoTwinsAndNoCopies) {
  for (const char* name : {"none", "fp16", "qsgd", "topk", "threshold"}) {
    EXPECT_TRUE(absl::IsUnavailable(CreateDeviceCodec({name, {}}).status()))
        << name;
  }
  EXPECT_EQ(ComputeDevice(), "cpu");
  DeviceCodecs twins;
  EXPECT_EQ(twins.Get({"fp16", {}}), nullptr);
  EXPECT_EQ(twins.Get({"fp16", {}}), nullptr);  // asked again: still none
  char host[8] = {};
  int device_word = 0;  // never dereferenced: there is no device
  EXPECT_TRUE(absl::IsUnavailable(
      CopyDeviceToHost(0, &device_word, absl::MakeSpan(host))));
  EXPECT_TRUE(absl::IsUnavailable(
      CopyHostToDevice(0, absl::MakeConstSpan(host), &device_word)));
}

TEST_F(NoGpuTest, ReduceOfADeviceTensorFailsUnavailable) {
  codecs::StateStore store;
  Metrics metrics(&store, "test");
  LocalCollective collective;
  auto engine = Engine::Create(EngineOptions(), codecs::BuiltinCodecs(), &store,
                               &collective, &metrics, Policy());
  ASSERT_TRUE(engine.ok()) << engine.status();
  int input = 0, output = 0;  // stand-ins for device addresses
  const DeviceTensor device{0, &input, &output, sizeof(float)};
  ReduceInput in;
  in.tensor = "w";
  in.shape = {1};
  in.codec = CodecSpec{"fp16", {}};
  in.device = &device;
  absl::StatusOr<ReduceOutput> out = (*engine)->Reduce(in);
  EXPECT_TRUE(absl::IsUnavailable(out.status())) << out.status();
  EXPECT_NE(out.status().message().find("tensor 'w' step 0"), std::string::npos)
      << out.status();
  EXPECT_EQ(input, 0);
  EXPECT_EQ(output, 0);
  EXPECT_EQ(MetricValue(*metrics.collectable(), "gradcomp_reduce_total",
                        {{"codec", "unresolved"}, {"code", "UNAVAILABLE"}}),
            1);
  EXPECT_EQ(MetricValue(*metrics.collectable(), "gradcomp_reduce_backend_total",
                        {{"codec", "fp16"}, {"backend", "cuda"}}),
            0);
}

}  // namespace
}  // namespace gradcomp::service
