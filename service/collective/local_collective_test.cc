#include "service/collective/local_collective.h"

#include <vector>

#include "codecs/wire.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradcomp::service {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

codecs::Bytes DensePayload(const std::vector<float>& values) {
  codecs::WireHeader header;
  header.codec = codecs::CodecId::kNone;
  header.flags = codecs::kFlagDenseBody;
  header.numel = values.size();
  codecs::Bytes payload;
  codecs::WriteDensePayload(header, codecs::ElemType::kF32, values, &payload);
  return payload;
}

TEST(LocalCollectiveTest, SumIsTheOwnDenseBody) {
  LocalCollective collective;
  EXPECT_EQ(collective.world_size(), 1);
  codecs::Round round{codecs::Collective::kSum, DensePayload({1, -2, 3.5})};
  auto result = collective.Run({"job", "t", 0, 0}, std::move(round));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->world_size, 1);
  EXPECT_THAT(result->sum, ElementsAre(1, -2, 3.5));
  EXPECT_TRUE(result->payloads.empty());
}

TEST(LocalCollectiveTest, GatherIsTheOwnPayload) {
  LocalCollective collective;
  const codecs::Bytes payload = DensePayload({4, 5});
  auto result = collective.Run({"job", "t", 0, 0},
                               {codecs::Collective::kGather, payload});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_THAT(result->payloads, ElementsAre(payload));
  EXPECT_TRUE(result->sum.empty());
}

TEST(LocalCollectiveTest, SumOfAPayloadWithoutDenseBodyIsAnError) {
  codecs::WireHeader header;
  header.codec = codecs::CodecId::kTopK;
  header.numel = 4;
  codecs::Bytes payload;
  codecs::WritePayload(header, "", "", &payload);
  LocalCollective collective;
  auto result = collective.Run({"job", "fc1.weight", 3, 0},
                               {codecs::Collective::kSum, payload});
  ASSERT_EQ(result.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(result.status().message(),
              HasSubstr("tensor 'fc1.weight' step 3 round 0"));
}

TEST(LocalCollectiveTest, MalformedPayloadIsInvalidArgument) {
  LocalCollective collective;
  auto result = collective.Run({"job", "t", 0, 0},
                               {codecs::Collective::kSum, "not a payload"});
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace gradcomp::service
