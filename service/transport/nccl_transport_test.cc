// The NCCL transport on a GPU (tag gpu; skipped without one). One machine has
// one GPU and NCCL refuses two ranks of a communicator on one device, so the
// wire protocol is checked through a one-rank communicator sending to itself
// (NCCL loopback), and the transport with one rank.
#include "service/transport/nccl_transport.h"

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "codecs/cuda/device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/transport/nccl_transport_exchange.h"
#include "service/transport/nccl_transport_testing.h"

namespace gradcomp::service {
namespace {

using ::testing::HasSubstr;

#define SKIP_WITHOUT_GPU()                                      \
  do {                                                          \
    absl::Status gpu = codecs::cuda::CudaDeviceAvailable();     \
    if (!gpu.ok()) GTEST_SKIP() << "no GPU: " << gpu.message(); \
  } while (false)

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

std::unique_ptr<NcclExchange> OneRank() {
  absl::StatusOr<std::string> id = NewNcclUniqueId();
  EXPECT_TRUE(id.ok()) << id.status();
  absl::StatusOr<std::unique_ptr<NcclExchange>> exchange =
      NcclExchange::Create(*id, 1, 0, 0, absl::Seconds(60));
  EXPECT_TRUE(exchange.ok()) << exchange.status();
  return exchange.ok() ? std::move(*exchange) : nullptr;
}

TEST(NcclExchangeTest, LoopbackCarriesMessagesOfEverySize) {
  SKIP_WITHOUT_GPU();
  std::unique_ptr<NcclExchange> exchange = OneRank();
  ASSERT_NE(exchange, nullptr);
  // Round 0 is an empty message (present, 0 bytes). Sizes grow, shrink and
  // grow again: the staging buffers are reused.
  const std::vector<size_t> sizes = {
      0, 1, 0, 7, (1 << 20) + 3, 5, (3 << 20) + 1};
  for (size_t round = 0; round < sizes.size(); ++round) {
    const std::string a = RandomBytes(sizes[round], round);
    const std::string b = RandomBytes(round, 100 + round);
    NcclExchange::Outgoing out{true, {a, b}};
    absl::StatusOr<std::vector<std::optional<codecs::Bytes>>> in =
        exchange->Run({0}, {out}, absl::Now() + absl::Seconds(60));
    ASSERT_TRUE(in.ok()) << in.status();
    ASSERT_EQ(in->size(), 1u);
    ASSERT_TRUE((*in)[0].has_value()) << "round " << round;
    EXPECT_EQ(*(*in)[0], a + b) << "round " << round;
  }
}

TEST(NcclExchangeTest, RoundWithNothingDeliversNothing) {
  SKIP_WITHOUT_GPU();
  std::unique_ptr<NcclExchange> exchange = OneRank();
  ASSERT_NE(exchange, nullptr);
  for (int round = 0; round < 3; ++round) {
    absl::StatusOr<std::vector<std::optional<codecs::Bytes>>> in =
        exchange->Run({0}, {NcclExchange::Outgoing{}},
                      absl::Now() + absl::Seconds(60));
    ASSERT_TRUE(in.ok()) << in.status();
    ASSERT_EQ(in->size(), 1u);
    EXPECT_FALSE((*in)[0].has_value());
  }
}

TEST(NcclExchangeTest, MismatchedArgumentsAreRejected) {
  SKIP_WITHOUT_GPU();
  std::unique_ptr<NcclExchange> exchange = OneRank();
  ASSERT_NE(exchange, nullptr);
  EXPECT_EQ(exchange->Run({0}, {}, absl::InfiniteFuture()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      exchange->Run({1}, {NcclExchange::Outgoing{}}, absl::InfiniteFuture())
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
}

TEST(NcclExchangeTest, RankThatNeverJoinsEndsInDeadlineExceeded) {
  SKIP_WITHOUT_GPU();
  absl::StatusOr<std::string> id = NewNcclUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  // Rank 1 never comes: the non-blocking init is aborted at the deadline.
  absl::Status status =
      NcclExchange::Create(*id, 2, 0, 0, absl::Seconds(2)).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_THAT(status.message(), HasSubstr("rank 0"));
}

TEST(NcclTransportTest, OneRankStartsRejectsSendsAndStops) {
  SKIP_WITHOUT_GPU();
  FailingReceiver receiver;
  absl::StatusOr<std::unique_ptr<NcclTransport>> transport =
      CreateOneRankNcclTransport(&receiver);
  ASSERT_TRUE(transport.ok()) << transport.status();
  EXPECT_EQ((*transport)->rank(), 0);
  EXPECT_EQ((*transport)->world_size(), 1);
  EXPECT_EQ((*transport)->PeerName(3), "rank 3 (NCCL)");
  const MessageKey key{"job", "w", 1, 0, Phase::kGather};
  auto data = std::make_shared<const codecs::Bytes>("abc");
  for (int to : {0, 1, -1}) {
    absl::Status status =
        (*transport)->Send(to, key, data, absl::InfiniteFuture());
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(status.message(), HasSubstr("expected another rank"));
  }
}

}  // namespace
}  // namespace gradcomp::service
