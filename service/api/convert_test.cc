#include "service/api/convert.h"

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradcomp::service {
namespace {

TEST(ConvertTest, GossipModeAndSpec) {
  v1::ReduceRequest request;
  request.set_mode(v1::REDUCE_MODE_GOSSIP);
  request.mutable_gossip()->set_topology("torus:2x4");
  request.mutable_gossip()->set_rank(2);
  request.mutable_gossip()->set_power_steps(3);
  request.mutable_gossip()->set_diffusion(1.308);
  request.set_consensus_distance(0.5);
  EXPECT_FALSE(ReduceInputFromProto(request)->gossip.fresh_factors);
  request.mutable_gossip()->set_fresh_factors(true);
  auto input = ReduceInputFromProto(request);
  ASSERT_TRUE(input.ok()) << input.status();
  EXPECT_EQ(input->mode, ReduceMode::kGossip);
  EXPECT_EQ(input->gossip.topology, "torus:2x4");
  EXPECT_EQ(input->gossip.rank, 2u);
  EXPECT_EQ(input->gossip.power_steps, 3u);
  EXPECT_EQ(input->gossip.diffusion, 1.308);
  EXPECT_TRUE(input->gossip.fresh_factors);
  EXPECT_EQ(input->consensus_distance, 0.5);
  EXPECT_EQ(ReduceInputFromProto(v1::ReduceRequest())->mode,
            ReduceMode::kAverage);
  request.set_mode(static_cast<v1::ReduceMode>(7));
  EXPECT_EQ(ReduceInputFromProto(request).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ConvertTest, RequestFieldsReachTheEngineInput) {
  v1::ReduceRequest request;
  request.set_job("j");
  request.set_tensor("t");
  request.set_step(9);
  request.set_dtype(v1::DTYPE_BFLOAT16);
  request.add_shape(2);
  request.add_shape(3);
  request.set_data("abcdefghijkl");
  request.mutable_codec()->set_name("topk");
  (*request.mutable_codec()->mutable_params())["ratio"] = "0.1";
  auto input = ReduceInputFromProto(request);
  ASSERT_TRUE(input.ok()) << input.status();
  EXPECT_EQ(input->job, "j");
  EXPECT_EQ(input->tensor, "t");
  EXPECT_EQ(input->step, 9);
  EXPECT_EQ(input->dtype, DType::kBFloat16);
  EXPECT_EQ(input->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(input->data.data(), request.data().data());  // a view, no copy
  ASSERT_TRUE(input->codec.has_value());
  EXPECT_EQ(input->codec->params.at("ratio"), "0.1");
}

TEST(ConvertTest, NoCodecMeansThePolicyDecides) {
  auto input = ReduceInputFromProto(v1::ReduceRequest());
  ASSERT_TRUE(input.ok());
  EXPECT_FALSE(input->codec.has_value());
}

TEST(ConvertTest, ABatchReachesTheEngineInputSortedOrItsPartsBatch) {
  v1::ReduceRequest request;
  request.set_tensor("b");
  request.mutable_batch()->set_id("bucket0");
  request.mutable_batch()->add_members("b");
  request.mutable_batch()->add_members("a");
  auto input = ReduceInputFromProto(request);
  ASSERT_TRUE(input.ok()) << input.status();
  ASSERT_NE(input->batch, nullptr);
  EXPECT_EQ(input->batch->id, "bucket0");
  EXPECT_EQ(input->batch->members, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(ReduceInputFromProto(v1::ReduceRequest())->batch, nullptr);

  // A part gets the batch made once for its request.
  auto shared = std::make_shared<const BatchSpec>(*input->batch);
  request.clear_batch();
  EXPECT_EQ(ReduceInputFromProto(request, {}, shared)->batch, shared);

  request.mutable_batch()->set_id("");
  request.mutable_batch()->add_members("b");
  EXPECT_THAT(ReduceInputFromProto(request).status().message(),
              ::testing::HasSubstr("batch id is empty"));
}

TEST(ConvertTest, SharedMemorySlicesBecomeTheInputAndOutput) {
  v1::ReduceRequest request;
  request.set_tensor("t");
  request.mutable_input_shm()->set_region("r");
  request.mutable_input_shm()->set_byte_size(8);
  request.mutable_output_shm()->set_region("r");
  request.mutable_output_shm()->set_byte_size(8);
  char memory[16] = "abcdefgh";
  MappedSlices slices{absl::MakeSpan(memory, 8), absl::MakeSpan(memory + 8, 8)};
  auto input = ReduceInputFromProto(request, slices);
  ASSERT_TRUE(input.ok()) << input.status();
  EXPECT_EQ(input->data.data(), memory);  // the mapping itself, no copy
  EXPECT_EQ(input->data.size(), 8u);
  EXPECT_EQ(input->output.data(), memory + 8);
  EXPECT_EQ(input->output.size(), 8u);

  // Inline input with a shared-memory output.
  request.set_data("12345678");
  input = ReduceInputFromProto(request, {{}, slices.output});
  ASSERT_TRUE(input.ok());
  EXPECT_EQ(input->data.data(), request.data().data());
  EXPECT_EQ(input->output.data(), memory + 8);
}

TEST(ConvertTest, OverlappingSlicesAreRefused) {
  v1::ReduceRequest request;
  request.mutable_input_shm()->set_region("r");
  request.mutable_output_shm()->set_region("r");
  request.mutable_output_shm()->set_byte_size(8);
  char memory[16] = {};
  auto overlap = ReduceInputFromProto(
      request, {absl::MakeSpan(memory, 8), absl::MakeSpan(memory + 7, 8)});
  EXPECT_EQ(overlap.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(overlap.status().message().find("overlap"), std::string::npos);
  EXPECT_TRUE(ReduceInputFromProto(request, {absl::MakeSpan(memory, 8),
                                             absl::MakeSpan(memory + 8, 8)})
                  .ok());
}

TEST(ConvertTest, AnEmptyOutputSliceIsRefused) {
  // The engine reads an empty output span as "answer inline".
  v1::ReduceRequest request;
  request.mutable_output_shm()->set_region("r");
  EXPECT_EQ(ReduceInputFromProto(request).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ConvertTest, ResponseCarriesIdsAndStats) {
  v1::ReduceRequest request;
  request.set_tensor("t");
  request.set_step(4);
  request.set_request_id(12);
  request.set_dtype(v1::DTYPE_FLOAT16);
  ReduceOutput output;
  output.data = "xy";
  output.stats.codec = "qsgd";
  output.stats.raw_bytes = 400;
  output.stats.wire_bytes = 50;
  output.stats.relative_error = NAN;
  output.stats.decode_seconds = 0.5;
  output.stats.dense_reason = "";
  output.stats.nonfinite_values = 0;
  const v1::ReduceResponse response =
      ReduceResponseToProto(request, std::move(output));
  EXPECT_EQ(response.tensor(), "t");
  EXPECT_EQ(response.step(), 4);
  EXPECT_EQ(response.request_id(), 12u);
  EXPECT_EQ(response.dtype(), v1::DTYPE_FLOAT16);
  EXPECT_EQ(response.data(), "xy");
  EXPECT_EQ(response.stats().codec(), "qsgd");
  EXPECT_EQ(response.stats().wire_bytes(), 50u);
  EXPECT_TRUE(std::isnan(response.stats().relative_error()));
  EXPECT_EQ(response.stats().timings().decode_seconds(), 0.5);
}

}  // namespace
}  // namespace gradcomp::service
