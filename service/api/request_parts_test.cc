#include "service/api/request_parts.h"

#include <cstdint>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradcomp::service {
namespace {

using ::testing::HasSubstr;

v1::SharedMemorySlice Slice(const std::string& region, uint64_t offset,
                            uint64_t bytes) {
  v1::SharedMemorySlice slice;
  slice.set_region(region);
  slice.set_offset(offset);
  slice.set_byte_size(bytes);
  return slice;
}

// A bucket of fp32 parts back to back: a 2 x 3 weight and a 3-vector bias,
// inputs at offset 64 of region "r", outputs at offset 1024.
v1::ReduceRequest Bucket() {
  v1::ReduceRequest request;
  request.set_job("job");
  request.set_step(7);
  request.set_dtype(v1::DTYPE_FLOAT32);
  request.set_request_id(42);
  request.mutable_codec()->set_name("topk");
  request.mutable_batch()->set_id("b0");
  request.mutable_batch()->add_members("fc.weight");
  request.mutable_batch()->add_members("fc.bias");
  *request.mutable_input_shm() = Slice("r", 64, 36);
  *request.mutable_output_shm() = Slice("r", 1024, 36);
  v1::ReducePart* weight = request.add_parts();
  weight->set_tensor("fc.weight");
  weight->add_shape(2);
  weight->add_shape(3);
  weight->set_offset(0);
  v1::ReducePart* bias = request.add_parts();
  bias->set_tensor("fc.bias");
  bias->add_shape(3);
  bias->set_offset(24);
  return request;
}

TEST(SplitPartsTest, EachPartIsARequestOfItsOwnOverItsBytes) {
  absl::StatusOr<SplitRequest> split = SplitParts(Bucket());
  ASSERT_TRUE(split.ok()) << split.status();
  ASSERT_EQ(split->parts.size(), 2u);
  const v1::ReduceRequest& weight = split->parts[0];
  EXPECT_EQ(weight.tensor(), "fc.weight");
  EXPECT_THAT(weight.shape(), ::testing::ElementsAre(2, 3));
  EXPECT_EQ(weight.request_id(), 0u);
  EXPECT_EQ(weight.input_shm().region(), "r");
  EXPECT_EQ(weight.input_shm().offset(), 64u);
  EXPECT_EQ(weight.input_shm().byte_size(), 24u);
  EXPECT_EQ(weight.output_shm().offset(), 1024u);
  EXPECT_EQ(weight.output_shm().byte_size(), 24u);
  const v1::ReduceRequest& bias = split->parts[1];
  EXPECT_EQ(bias.tensor(), "fc.bias");
  EXPECT_EQ(bias.request_id(), 1u);
  EXPECT_EQ(bias.input_shm().offset(), 88u);
  EXPECT_EQ(bias.input_shm().byte_size(), 12u);
  EXPECT_EQ(bias.output_shm().offset(), 1048u);
  for (const v1::ReduceRequest& part : split->parts) {
    EXPECT_EQ(part.parts_size(), 0);
    EXPECT_EQ(part.job(), "job");
    EXPECT_EQ(part.step(), 7);
    EXPECT_EQ(part.dtype(), v1::DTYPE_FLOAT32);
    EXPECT_EQ(part.codec().name(), "topk");
    // The batch is made once, for every part, not copied into each.
    EXPECT_FALSE(part.has_batch());
  }
  ASSERT_NE(split->batch, nullptr);
  EXPECT_EQ(split->batch->id, "b0");
  EXPECT_EQ(split->batch->members,
            (std::vector<std::string>{"fc.bias", "fc.weight"}));
}

TEST(SplitPartsTest, PartsOfHalfWidthFollowTheDtype) {
  v1::ReduceRequest request = Bucket();
  request.set_dtype(v1::DTYPE_FLOAT16);
  request.mutable_parts(1)->set_offset(12);
  absl::StatusOr<SplitRequest> split = SplitParts(request);
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_EQ(split->parts[0].input_shm().byte_size(), 12u);
  EXPECT_EQ(split->parts[1].input_shm().byte_size(), 6u);
}

void ExpectRefused(const v1::ReduceRequest& request,
                   const std::string& message) {
  absl::StatusOr<SplitRequest> split = SplitParts(request);
  ASSERT_FALSE(split.ok());
  EXPECT_EQ(split.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(split.status().message()), HasSubstr(message));
}

TEST(SplitPartsTest, RefusesARequestThatAlsoNamesATensor) {
  v1::ReduceRequest request = Bucket();
  request.set_tensor("fc.weight");
  ExpectRefused(request, "expected tensor, shape and data unset");
}

TEST(SplitPartsTest, RefusesPartsWithoutBothSlices) {
  v1::ReduceRequest request = Bucket();
  request.clear_output_shm();
  ExpectRefused(request, "expected input_shm and output_shm set");
  // Inline data replaces input_shm (one oneof), and parts take no data.
  request = Bucket();
  request.set_data("inline");
  ExpectRefused(request, "expected tensor, shape and data unset");
}

TEST(SplitPartsTest, RefusesOverlappingSlices) {
  v1::ReduceRequest request = Bucket();
  *request.mutable_output_shm() = Slice("r", 80, 36);
  ExpectRefused(request, "overlap in region 'r'");
  // The same offsets in another region are fine.
  request.mutable_output_shm()->set_region("other");
  EXPECT_TRUE(SplitParts(request).ok());
}

TEST(SplitPartsTest, RefusesAPartOutsideTheSlices) {
  v1::ReduceRequest request = Bucket();
  request.mutable_parts(1)->set_offset(28);  // 28 + 12 > 36
  ExpectRefused(request,
                "part 1 ('fc.bias') at offset 28: shape [3] needs "
                "more than the 8 bytes");
  request.mutable_parts(1)->set_offset(100);
  ExpectRefused(request, "part 1 ('fc.bias'): offset 100 is past the 36");
  // The smaller slice bounds the parts.
  request = Bucket();
  request.mutable_output_shm()->set_byte_size(30);
  ExpectRefused(request, "part 1 ('fc.bias') at offset 24");
  // A scalar (no dimensions) needs its 4 bytes too (found by the fuzzer).
  request = Bucket();
  request.mutable_parts(1)->clear_shape();
  request.mutable_parts(1)->set_offset(36);
  ExpectRefused(request,
                "part 1 ('fc.bias') at offset 36: shape [] needs 4 "
                "bytes, more than the 0 bytes");
  request.mutable_parts(1)->set_offset(32);
  EXPECT_TRUE(SplitParts(request).ok());
}

TEST(SplitPartsTest, RefusesSlicesThatWrapAround) {
  v1::ReduceRequest request = Bucket();
  request.mutable_input_shm()->set_offset(UINT64_MAX - 8);
  ExpectRefused(request,
                "input_shm: offset 18446744073709551607 + byte_size "
                "36 wraps around");
}

TEST(SplitPartsTest, RefusesHugeShapesWithoutOverflow) {
  v1::ReduceRequest request = Bucket();
  v1::ReducePart* part = request.mutable_parts(1);
  part->clear_shape();
  part->add_shape(int64_t{1} << 40);
  part->add_shape(int64_t{1} << 40);
  ExpectRefused(request, "needs more than");
  part->set_shape(0, -1);
  ExpectRefused(request, "dimension 0 is -1, expected >= 0");
}

// A zero-element part has no bytes: it goes inline, whatever its offset,
// and however large its other dimensions.
TEST(SplitPartsTest, AZeroElementPartGoesInline) {
  v1::ReduceRequest request = Bucket();
  v1::ReducePart* empty = request.add_parts();
  empty->set_tensor("empty");
  empty->add_shape(int64_t{1} << 40);
  empty->add_shape(0);
  empty->set_offset(24);  // where fc.bias starts: no overlap, it holds none
  absl::StatusOr<SplitRequest> split = SplitParts(request);
  ASSERT_TRUE(split.ok()) << split.status();
  ASSERT_EQ(split->parts.size(), 3u);
  const v1::ReduceRequest& part = split->parts[2];
  EXPECT_EQ(part.tensor(), "empty");
  EXPECT_FALSE(part.has_input_shm());
  EXPECT_FALSE(part.has_output_shm());
  EXPECT_TRUE(part.has_data());
  EXPECT_TRUE(part.data().empty());
  EXPECT_THAT(part.shape(), ::testing::ElementsAre(int64_t{1} << 40, 0));
  EXPECT_EQ(split->parts[1].input_shm().byte_size(), 12u);
}

TEST(SplitPartsTest, RefusesOverlappingRepeatedOrUnnamedParts) {
  v1::ReduceRequest request = Bucket();
  request.mutable_parts(1)->set_offset(20);
  ExpectRefused(request,
                "parts 0 ('fc.weight', bytes 0..24) and 1 "
                "('fc.bias', from byte 20) overlap");
  request = Bucket();
  request.mutable_parts(1)->set_tensor("fc.weight");
  ExpectRefused(request, "part 1 ('fc.weight'): tensor repeats");
  request.mutable_parts(1)->set_tensor("");
  ExpectRefused(request, "part 1 (''): tensor is empty");
}

TEST(SplitPartsTest, RefusesTooManyPartsAndBadDtypes) {
  v1::ReduceRequest request = Bucket();
  request.set_dtype(v1::DTYPE_UNSPECIFIED);
  absl::StatusOr<SplitRequest> split = SplitParts(request);
  EXPECT_EQ(split.status().code(), absl::StatusCode::kInvalidArgument);
  request = Bucket();
  request.clear_parts();
  for (size_t i = 0; i <= kMaxRequestParts; ++i) {
    v1::ReducePart* part = request.add_parts();
    part->set_tensor("t" + std::to_string(i));
  }
  ExpectRefused(request, "expected at most 128");
}

TEST(SplitPartsTest, ABadBatchRefusesTheRequestAndNoBatchIsNull) {
  v1::ReduceRequest request = Bucket();
  request.mutable_batch()->add_members("fc.bias");
  ExpectRefused(request, "names member 'fc.bias' twice");
  request.clear_batch();
  absl::StatusOr<SplitRequest> split = SplitParts(request);
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_EQ(split->batch, nullptr);
}

}  // namespace
}  // namespace gradcomp::service
