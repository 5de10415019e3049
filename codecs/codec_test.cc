#include "codecs/codec.h"

#include <cstring>
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

TEST_F(SingleRoundSessionTest, WithoutKeepOwnThePayloadIsHandedOver) {
  RoundingCodec codec(1.0f, /*summable=*/false);
  auto kept = *codec.Start(view_, state_, ctx_);
  StepContext no_own = ctx_;
  no_own.keep_own = false;
  auto handed = *codec.Start(view_, state_, no_own);
  std::optional<Round> a = *kept->NextRound();
  std::optional<Round> b = *handed->NextRound();
  ASSERT_TRUE(a.has_value() && b.has_value());
  EXPECT_EQ(a->payload, b->payload);
  EXPECT_EQ(a->collective, b->collective);

  RoundResult result;
  result.world_size = 2;
  result.payloads = {b->payload, b->payload};
  ASSERT_TRUE(handed->Absorb(std::move(result)).ok());
  std::vector<float> out(3);
  ASSERT_TRUE(handed->Finish(absl::MakeSpan(out)).ok());
  EXPECT_THAT(out, ElementsAre(0.0f, -1.0f, 3.0f));
  absl::Status own = handed->DecodeOwn(absl::MakeSpan(out));
  EXPECT_EQ(own.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(own.message(), HasSubstr("keep_own false"));
  EXPECT_TRUE(kept->DecodeOwn(absl::MakeSpan(out)).ok());
}

// RoundingCodec, able to finish a sum in place (the base FinishSum is).
class InPlaceRoundingCodec : public RoundingCodec {
 public:
  InPlaceRoundingCodec() : RoundingCodec(1.0f, /*summable=*/true) {}
  bool FinishSumInPlace() const override { return true; }
};

TEST_F(SingleRoundSessionTest, SumWrittenIntoTheOutputIsFinishedInPlace) {
  InPlaceRoundingCodec codec;
  auto session = *codec.Start(view_, state_, ctx_);
  ASSERT_TRUE(session->NextRound().ok());
  std::vector<float> out = {4.0f, -2.0f, 1.0f};  // the collective's sum
  RoundResult result;
  result.world_size = 2;
  result.summed_into = absl::MakeSpan(out);
  ASSERT_TRUE(session->Absorb(std::move(result)).ok());
  std::vector<float> elsewhere(3);
  absl::Status wrong = session->Finish(absl::MakeSpan(elsewhere));
  EXPECT_EQ(wrong.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wrong.message(), HasSubstr("not this output"));
  ASSERT_TRUE(session->Finish(absl::MakeSpan(out)).ok());
  EXPECT_THAT(out, ElementsAre(2.0f, -1.0f, 0.5f));

  // A codec that does not finish in place refuses such a result.
  RoundingCodec not_in_place(1.0f, /*summable=*/true);
  EXPECT_FALSE(not_in_place.FinishSumInPlace());
  auto other = *not_in_place.Start(view_, state_, ctx_);
  ASSERT_TRUE(other->NextRound().ok());
  RoundResult in_out;
  in_out.world_size = 2;
  in_out.summed_into = absl::MakeSpan(out);
  ASSERT_TRUE(other->Absorb(std::move(in_out)).ok());
  EXPECT_EQ(other->Finish(absl::MakeSpan(out)).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(SingleRoundSessionTest, SumRoundDividesOddLengthsElementByElement) {
  // 11 elements: two blocks of four and a tail of three; W = 3 is not a
  // power of two, so a reciprocal multiply would differ in the last bit.
  RoundingCodec codec(1.0f, /*summable=*/true);
  std::vector<float> sum(11);
  for (size_t i = 0; i < sum.size(); ++i) sum[i] = 0.1f * (i + 1) - 0.37f;
  std::vector<float> out(11);
  ASSERT_TRUE(codec.FinishSum(sum, 3, ctx_, absl::MakeSpan(out)).ok());
  for (size_t i = 0; i < sum.size(); ++i) {
    const float expected = sum[i] / 3.0f;
    EXPECT_EQ(std::memcmp(&out[i], &expected, sizeof(float)), 0) << i;
  }
  // In place (sum and out the same memory), the same values.
  ASSERT_TRUE(codec.FinishSum(sum, 3, ctx_, absl::MakeSpan(sum)).ok());
  EXPECT_EQ(std::memcmp(sum.data(), out.data(), sum.size() * sizeof(float)), 0);
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
