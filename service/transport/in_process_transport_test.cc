#include "service/transport/in_process_transport.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradcomp::service {
namespace {

using ::testing::HasSubstr;

struct Recorder : Receiver {
  void OnMessage(int from, const MessageKey& key, codecs::Bytes data) override {
    messages.push_back({from, key.tensor, std::move(data)});
  }
  void OnPeerLost(int rank, const absl::Status& why) override {
    lost.push_back(rank);
    last_why = why;
  }
  void OnCorruptMessage(int from, const MessageKey& key,
                        const absl::Status& why) override {
    ADD_FAILURE() << "in-process messages cannot be damaged: " << why;
  }
  struct Message {
    int from;
    std::string tensor;
    codecs::Bytes data;
  };
  std::vector<Message> messages;
  std::vector<int> lost;
  absl::Status last_why;
};

std::shared_ptr<const codecs::Bytes> Data(std::string s) {
  return std::make_shared<const codecs::Bytes>(std::move(s));
}

TEST(InProcessTransportTest, DeliversToTheAddressedRank) {
  InProcessHub hub(3);
  Recorder r0, r1, r2;
  auto t0 = hub.Connect(0, &r0);
  auto t1 = hub.Connect(1, &r1);
  auto t2 = hub.Connect(2, &r2);
  EXPECT_EQ(t1->rank(), 1);
  EXPECT_EQ(t1->world_size(), 3);
  MessageKey key{"job", "w", 4, 0, Phase::kGather};
  ASSERT_TRUE(t0->Send(2, key, Data("abc"), absl::InfiniteFuture()).ok());
  ASSERT_EQ(r2.messages.size(), 1u);
  EXPECT_EQ(r2.messages[0].from, 0);
  EXPECT_EQ(r2.messages[0].tensor, "w");
  EXPECT_EQ(r2.messages[0].data, "abc");
  EXPECT_TRUE(r0.messages.empty());
  EXPECT_TRUE(r1.messages.empty());
  EXPECT_EQ(t0->Send(0, key, Data("x"), absl::InfiniteFuture()).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(InProcessTransportTest, KillTellsTheOthersAndCutsTheRankOff) {
  InProcessHub hub(3);
  Recorder r0, r1, r2;
  auto t0 = hub.Connect(0, &r0);
  auto t1 = hub.Connect(1, &r1);
  auto t2 = hub.Connect(2, &r2);
  hub.Kill(1);
  EXPECT_THAT(r0.lost, ::testing::ElementsAre(1));
  EXPECT_THAT(r2.lost, ::testing::ElementsAre(1));
  EXPECT_TRUE(r1.lost.empty());
  EXPECT_THAT(r0.last_why.message(), HasSubstr("rank 1"));
  MessageKey key{"job", "w", 0, 0, Phase::kGather};
  absl::Status to_dead = t0->Send(1, key, Data("a"), absl::InfiniteFuture());
  EXPECT_EQ(to_dead.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(to_dead.message(), HasSubstr("rank 1"));
  EXPECT_EQ(t1->Send(2, key, Data("a"), absl::InfiniteFuture()).code(),
            absl::StatusCode::kUnavailable);
  hub.Revive(1);
  EXPECT_TRUE(t0->Send(1, key, Data("a"), absl::InfiniteFuture()).ok());
  EXPECT_EQ(r1.messages.size(), 1u);
}

}  // namespace
}  // namespace gradcomp::service
