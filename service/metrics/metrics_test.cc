#include "service/metrics/metrics.h"

#include <vector>

#include "codecs/state.h"
#include "gtest/gtest.h"
#include "service/metrics/metrics_testing.h"

namespace gradcomp::service {
namespace {

TEST(MetricsTest, CountersCarryCodecAndGrpcCodeNames) {
  Metrics metrics(nullptr, "1.2.3");
  metrics.CountReduce("topk", absl::StatusCode::kOk);
  metrics.CountReduce("topk", absl::StatusCode::kOk);
  metrics.CountReduce("unresolved", absl::StatusCode::kInvalidArgument);
  const auto& c = *metrics.collectable();
  EXPECT_EQ(MetricValue(c, "gradcomp_reduce_total",
                        {{"codec", "topk"}, {"code", "OK"}}),
            2);
  EXPECT_EQ(
      MetricValue(c, "gradcomp_reduce_total",
                  {{"codec", "unresolved"}, {"code", "INVALID_ARGUMENT"}}),
      1);
}

TEST(MetricsTest, StreamPoolThreadsByStateAndQueuedTensors) {
  Metrics metrics(nullptr, "1.2.3");
  metrics.SetStreamPool(3, 5, 2, 7);
  const auto& c = *metrics.collectable();
  EXPECT_EQ(MetricValue(c, "gradcomp_stream_workers", {{"state", "running"}}),
            3);
  EXPECT_EQ(MetricValue(c, "gradcomp_stream_workers", {{"state", "waiting"}}),
            5);
  EXPECT_EQ(MetricValue(c, "gradcomp_stream_workers", {{"state", "idle"}}), 2);
  EXPECT_EQ(MetricValue(c, "gradcomp_stream_queued_tensors"), 7);
}

TEST(MetricsTest, BytesErrorsDenseAndNonfinite) {
  Metrics metrics(nullptr, "1.2.3");
  metrics.AddBytes("qsgd", 4000, 500);
  metrics.AddBytes("qsgd", 4000, 700);
  metrics.ObserveRelativeError("qsgd", 0.1);
  metrics.ObserveRelativeError("qsgd", 0.3);
  metrics.CountDense("small");
  metrics.AddNonfinite(3);
  metrics.ObserveStage(Stage::kEncode, 1e-4);
  const auto& c = *metrics.collectable();
  EXPECT_EQ(MetricValue(c, "gradcomp_raw_bytes_total", {{"codec", "qsgd"}}),
            8000);
  EXPECT_EQ(MetricValue(c, "gradcomp_wire_bytes_total", {{"codec", "qsgd"}}),
            1200);
  EXPECT_EQ(MetricValue(c, "gradcomp_compression_relative_error",
                        {{"codec", "qsgd"}}),
            2);
  EXPECT_EQ(MetricValue(c, "gradcomp_dense_total", {{"reason", "small"}}), 1);
  EXPECT_EQ(MetricValue(c, "gradcomp_nonfinite_values_total"), 3);
  EXPECT_EQ(
      MetricValue(c, "gradcomp_stage_duration_seconds", {{"stage", "encode"}}),
      1);
  EXPECT_EQ(
      MetricValue(c, "gradcomp_stage_duration_seconds", {{"stage", "decode"}}),
      0);
}

TEST(MetricsTest, RequestsByServiceMethodAndCode) {
  Metrics metrics(nullptr, "1.2.3");
  metrics.CountRequest("gradcomp.v1.Gradcomp", "GetInfo",
                       absl::StatusCode::kOk);
  metrics.CountRequest("gradcomp.v1.Gradcomp", "Reduce",
                       absl::StatusCode::kDeadlineExceeded);
  const auto& c = *metrics.collectable();
  EXPECT_EQ(MetricValue(c, "gradcomp_requests_total",
                        {{"service", "gradcomp.v1.Gradcomp"},
                         {"method", "GetInfo"},
                         {"code", "OK"}}),
            1);
  EXPECT_EQ(MetricValue(c, "gradcomp_requests_total",
                        {{"service", "gradcomp.v1.Gradcomp"},
                         {"method", "Reduce"},
                         {"code", "DEADLINE_EXCEEDED"}}),
            1);
}

TEST(MetricsTest, StepIsTheLastOneSet) {
  Metrics metrics(nullptr, "1.2.3");
  metrics.SetStep(7);
  metrics.SetStep(3);
  EXPECT_EQ(MetricValue(*metrics.collectable(), "gradcomp_step"), 3);
}

TEST(MetricsTest, ResidualNormByCodec) {
  Metrics metrics(nullptr, "1.2.3");
  metrics.ObserveResidualNorm("topk", 2.5);
  metrics.ObserveResidualNorm("topk", 0.5);
  metrics.ObserveResidualNorm("efsign", 1);
  const auto& c = *metrics.collectable();
  EXPECT_EQ(
      MetricValue(c, "gradcomp_residual_relative_norm", {{"codec", "topk"}}),
      2);
  EXPECT_EQ(
      MetricValue(c, "gradcomp_residual_relative_norm", {{"codec", "efsign"}}),
      1);
}

TEST(MetricsTest, BuildInfoIsOneWithVersionAndWireFormat) {
  Metrics metrics(nullptr, "1.2.3");
  EXPECT_EQ(MetricValue(*metrics.collectable(), "gradcomp_build_info",
                        {{"version", "1.2.3"}, {"wire_format", "1"}}),
            1);
}

TEST(MetricsTest, StateMetricsAreReadFromTheStoreAtCollection) {
  codecs::StateStore store;
  Metrics metrics(&store, "1.2.3");
  const auto& c = *metrics.collectable();
  EXPECT_EQ(MetricValue(c, "gradcomp_state_bytes"), 0);
  const std::vector<int64_t> shape = {4};
  {
    codecs::StateStore::Locked locked = store.Acquire("job", "t", shape, 1);
    locked->Buffer("ef.residual", 4);
  }
  EXPECT_EQ(MetricValue(c, "gradcomp_state_bytes"), 16);
  const std::vector<int64_t> reshaped = {2, 2};
  store.Acquire("job", "t", reshaped, 1);
  EXPECT_EQ(MetricValue(c, "gradcomp_state_resets_total"), 1);
}

}  // namespace
}  // namespace gradcomp::service
