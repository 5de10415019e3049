// PeerCollective over real gRPC transports with a byte changed in transit:
// the step fails loudly on the rank that received the damaged bytes, and the
// next step works.

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/free_port.h"
#include "codecs/wire.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/collective/mailbox.h"
#include "service/collective/peer_collective.h"
#include "service/metrics/metrics_testing.h"
#include "service/metrics/peer_metrics.h"
#include "service/peers/handshake.h"
#include "service/transport/grpc_transport.h"

namespace gradcomp::service {
namespace {

using ::testing::HasSubstr;

codecs::Round SumRound(const std::vector<float>& values) {
  codecs::WireHeader header;
  header.codec = codecs::CodecId::kNone;
  header.numel = values.size();
  codecs::Round round;
  round.collective = codecs::Collective::kSum;
  codecs::WriteDensePayload(header, codecs::ElemType::kF32, values,
                            &round.payload);
  return round;
}

TEST(PeerCollectiveChecksumTest, DamagedBytesFailTheStepOnTheReceivingRank) {
  constexpr int kWorld = 2;
  std::vector<std::string> peers;
  for (int r = 0; r < kWorld; ++r) {
    peers.push_back(
        absl::StrCat("127.0.0.1:", gradcomp::testing::FreePort().value()));
  }
  // Rank 1 damages one byte of what it sends for step 1 of "fc1.weight".
  std::atomic<int> tampered{0};
  std::vector<std::unique_ptr<PeerMetrics>> metrics;
  std::vector<std::unique_ptr<Mailbox>> mailboxes;
  std::vector<std::unique_ptr<GrpcTransport>> transports;
  std::vector<std::unique_ptr<PeerCollective>> collectives;
  for (int r = 0; r < kWorld; ++r) {
    metrics.push_back(std::make_unique<PeerMetrics>(r, kWorld));
    mailboxes.push_back(
        std::make_unique<Mailbox>(kWorld, MailboxOptions{}, metrics[r].get()));
    GrpcTransportOptions options;
    options.rank = r;
    options.peers = peers;
    if (r == 1) {
      options.tamper_for_test = [&tampered](int, const MessageKey& key,
                                            std::string* chunk) {
        if (key.step == 1 && key.phase == Phase::kReduceScatter &&
            chunk->size() > 40) {
          (*chunk)[40] ^= 0x10;
          ++tampered;
        }
      };
    }
    PeerIdentity id;
    id.version = "test";
    id.world_size = kWorld;
    id.rank = r;
    id.instance = r + 1;
    auto transport = GrpcTransport::Create(
        options, [id] { return id; }, mailboxes[r].get(), metrics[r].get());
    ASSERT_TRUE(transport.ok()) << transport.status();
    transports.push_back(*std::move(transport));
    ASSERT_TRUE(transports[r]->Start().ok());
  }
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(
        transports[r]->WaitForPeers(absl::Now() + absl::Seconds(30)).ok());
    collectives.push_back(std::make_unique<PeerCollective>(
        transports[r].get(), mailboxes[r].get(),
        PeerCollectiveOptions{absl::Seconds(2)}, metrics[r].get()));
  }

  auto step = [&](int64_t s) {
    std::vector<absl::StatusOr<codecs::RoundResult>> out(kWorld);
    std::vector<std::thread> threads;
    for (int r = 0; r < kWorld; ++r) {
      threads.emplace_back([&, r] {
        out[r] =
            collectives[r]->Run({"job", "fc1.weight", s, 0},
                                SumRound(std::vector<float>(64, r + 1.0f)));
      });
    }
    for (std::thread& t : threads) t.join();
    return out;
  };

  std::vector<absl::StatusOr<codecs::RoundResult>> bad = step(1);
  EXPECT_GT(tampered.load(), 0);
  ASSERT_FALSE(bad[0].ok());
  EXPECT_EQ(bad[0].status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(bad[0].status().message(),
              HasSubstr(absl::StrCat("from rank 1 (", peers[1],
                                     ") for job 'job' tensor 'fc1.weight' "
                                     "step 1 round 0 failed its checksum")));
  EXPECT_EQ(
      MetricValue(*metrics[0]->collectable(),
                  "gradcomp_peer_checksum_failures_total", {{"peer", "1"}}),
      1);
  // Rank 1 never gets rank 0's summed slice: it fails too, at its deadline.
  EXPECT_FALSE(bad[1].ok());

  std::vector<absl::StatusOr<codecs::RoundResult>> good = step(2);
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(good[r].ok()) << good[r].status();
    EXPECT_EQ(good[r]->sum, std::vector<float>(64, 3.0f));
  }
  collectives.clear();
  transports.clear();
}

}  // namespace
}  // namespace gradcomp::service
