#include "codecs/codec.h"

#include <vector>

#include "codecs/testing/rounding_codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradcomp::codecs {
namespace {

using ::gradcomp::codecs::testing::RoundingCodec;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

class SingleRoundSessionTest : public ::testing::Test {
 protected:
  std::vector<float> grad_ = {0.3f, -1.2f, 2.6f};
  std::vector<int64_t> shape_ = {3};
  TensorView view_{grad_, shape_};
  TensorState state_;
  StepContext ctx_{
      .seed = 1, .tensor_id = 2, .step = 3, .rank = 0, .world_size = 2};
};

TEST_F(SingleRoundSessionTest, GatherRoundAveragesDecodedPayloads) {
  RoundingCodec codec(1.0f, /*summable=*/false);
  auto session = *codec.Start(view_, state_, ctx_);
  absl::StatusOr<std::optional<Round>> round = session->NextRound();
  ASSERT_TRUE(round.ok()) << round.status();
  ASSERT_TRUE(round->has_value());
  EXPECT_EQ((*round)->collective, Collective::kGather);

  // The other worker's gradient {1, 1, 1} encodes to itself.
  std::vector<float> other = {1.0f, 1.0f, 1.0f};
  Bytes other_payload;
  ASSERT_TRUE(codec.Encode({other, shape_}, state_, ctx_, &other_payload).ok());
  RoundResult result;
  result.world_size = 2;
  result.payloads = {(*round)->payload, other_payload};
  ASSERT_TRUE(session->Absorb(std::move(result)).ok());
  EXPECT_FALSE(session->NextRound()->has_value());

  std::vector<float> out(3);
  ASSERT_TRUE(session->Finish(absl::MakeSpan(out)).ok());
  EXPECT_THAT(out, ElementsAre(0.5f, -0.0f, 2.0f));  // (round(g) + 1) / 2
  ASSERT_TRUE(session->DecodeOwn(absl::MakeSpan(out)).ok());
  EXPECT_THAT(out, ElementsAre(0.0f, -1.0f, 3.0f));
}

TEST_F(SingleRoundSessionTest, SumRoundDividesTheSumByWorldSize) {
  RoundingCodec codec(1.0f, /*summable=*/true);
  auto session = *codec.Start(view_, state_, ctx_);
  std::optional<Round> round = *session->NextRound();
  ASSERT_TRUE(round.has_value());
  EXPECT_EQ(round->collective, Collective::kSum);
  RoundResult result;
  result.world_size = 2;
  result.sum = {4.0f, -2.0f, 1.0f};
  ASSERT_TRUE(session->Absorb(std::move(result)).ok());
  std::vector<float> out(3);
  ASSERT_TRUE(session->Finish(absl::MakeSpan(out)).ok());
  EXPECT_THAT(out, ElementsAre(2.0f, -1.0f, 0.5f));
}

TEST_F(SingleRoundSessionTest, CallsOutOfOrderAreFailedPrecondition) {
  RoundingCodec codec(1.0f, /*summable=*/false);
  auto session = *codec.Start(view_, state_, ctx_);
  std::vector<float> out(3);
  RoundResult empty;
  EXPECT_EQ(session->Absorb(empty).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(session->Finish(absl::MakeSpan(out)).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(session->DecodeOwn(absl::MakeSpan(out)).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(session->NextRound().ok());
  absl::Status again = session->NextRound().status();
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(again.message(), HasSubstr("NextRound called out of order"));
  EXPECT_EQ(session->Finish(absl::MakeSpan(out)).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(SingleRoundSessionTest, AbsorbChecksTheResultShape) {
  RoundingCodec gather(1.0f, false), sum(1.0f, true);
  auto g = *gather.Start(view_, state_, ctx_);
  ASSERT_TRUE(g->NextRound().ok());
  RoundResult one_payload;
  one_payload.world_size = 2;
  one_payload.payloads = {"x"};
  EXPECT_THAT(
      g->Absorb(one_payload).message(),
      HasSubstr("expected 2 gathered payloads (one per worker), got 1"));
  RoundResult zero_world;
  zero_world.world_size = 0;
  EXPECT_EQ(g->Absorb(zero_world).code(), absl::StatusCode::kInvalidArgument);

  auto s = *sum.Start(view_, state_, ctx_);
  ASSERT_TRUE(s->NextRound().ok());
  RoundResult short_sum;
  short_sum.world_size = 2;
  short_sum.sum = {1.0f};
  ASSERT_TRUE(s->Absorb(short_sum).ok());
  std::vector<float> out(3);
  EXPECT_THAT(s->Finish(absl::MakeSpan(out)).message(),
              HasSubstr("expected a sum of 3 elements, got 1"));
}

TEST_F(SingleRoundSessionTest, BadGatheredPayloadLeavesOutputUntouched) {
  RoundingCodec codec(1.0f, /*summable=*/false);
  auto session = *codec.Start(view_, state_, ctx_);
  absl::StatusOr<std::optional<Round>> round = session->NextRound();
  ASSERT_TRUE(round.ok() && round->has_value());
  const Bytes own = (*round)->payload;
  Bytes corrupt = own;
  corrupt[0] = 'X';
  RoundResult result;
  result.world_size = 2;
  result.payloads = {own, corrupt};
  ASSERT_TRUE(session->Absorb(std::move(result)).ok());
  std::vector<float> out = {7.0f, 7.0f, 7.0f};
  absl::Status s = session->Finish(absl::MakeSpan(out));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("payload of rank 1"));
  EXPECT_THAT(out, ElementsAre(7.0f, 7.0f, 7.0f));
  std::vector<float> wrong_size(2);
  EXPECT_EQ(session->Finish(absl::MakeSpan(wrong_size)).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(SingleRoundSessionTest, StartRejectsRankOutsideTheWorld) {
  RoundingCodec codec(1.0f, false);
  StepContext bad = ctx_;
  bad.rank = 2;
  EXPECT_EQ(codec.Start(view_, state_, bad).status().code(),
            absl::StatusCode::kInvalidArgument);
  bad.rank = 0;
  bad.world_size = 0;
  EXPECT_EQ(codec.Start(view_, state_, bad).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CollectiveNameTest, NamesBoth) {
  EXPECT_EQ(CollectiveName(Collective::kSum), "sum");
  EXPECT_EQ(CollectiveName(Collective::kGather), "gather");
}

}  // namespace
}  // namespace gradcomp::codecs
