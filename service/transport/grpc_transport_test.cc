#include "service/transport/grpc_transport.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/metrics/metrics_testing.h"
#include "service/metrics/peer_metrics.h"
#include "service/peers/handshake.h"

namespace gradcomp::service {
namespace {

using ::testing::HasSubstr;

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

// Keeps what arrives; Wait blocks until `n` messages are in.
class Inbox : public Receiver {
 public:
  struct Message {
    int from;
    MessageKey key;
    codecs::Bytes data;
  };
  void OnMessage(int from, const MessageKey& key, codecs::Bytes data) override {
    absl::MutexLock lock(&mu_);
    messages_.push_back({from, key, std::move(data)});
  }
  void OnPeerLost(int rank, const absl::Status& why) override {
    absl::MutexLock lock(&mu_);
    lost_.push_back(rank);
    why_ = why;
  }
  std::vector<Message> WaitMessages(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() { return messages_.size() >= n; };
    mu_.Await(absl::Condition(&enough));
    return messages_;
  }
  absl::Status WaitLost(int rank) {
    absl::MutexLock lock(&mu_);
    auto lost = [&]() {
      return std::find(lost_.begin(), lost_.end(), rank) != lost_.end();
    };
    mu_.Await(absl::Condition(&lost));
    return why_;
  }

 private:
  absl::Mutex mu_;
  std::vector<Message> messages_;
  std::vector<int> lost_;
  absl::Status why_;
};

class Cluster {
 public:
  explicit Cluster(int world_size) : inboxes_(world_size) {
    for (int r = 0; r < world_size; ++r) {
      addresses_.push_back(absl::StrCat("127.0.0.1:", FreePort()));
      metrics_.push_back(std::make_unique<PeerMetrics>(r, world_size));
      identities_.push_back(Identity(r, world_size));
    }
    transports_.resize(world_size);
  }

  static PeerIdentity Identity(int rank, int world_size) {
    PeerIdentity id;
    id.version = "test";
    id.wire_version = 1;
    id.world_size = world_size;
    id.rank = rank;
    id.policy_hash = "p";
    id.instance = rank + 1;
    return id;
  }

  absl::Status Start(int rank) {
    GrpcTransportOptions options;
    options.rank = rank;
    options.peers = addresses_;
    options.chunk_bytes = 64 << 10;
    const PeerIdentity identity = identities_[rank];
    auto transport = GrpcTransport::Create(
        options, [identity] { return identity; }, &inboxes_[rank],
        metrics_[rank].get());
    if (!transport.ok()) return transport.status();
    transports_[rank] = std::move(*transport);
    return transports_[rank]->Start();
  }
  void Stop(int rank) { transports_[rank].reset(); }

  GrpcTransport& transport(int rank) { return *transports_[rank]; }
  Inbox& inbox(int rank) { return inboxes_[rank]; }
  PeerIdentity& identity(int rank) { return identities_[rank]; }
  const std::string& address(int rank) const { return addresses_[rank]; }
  double Metric(int rank, const std::string& name,
                const std::map<std::string, std::string>& labels) {
    return MetricValue(*metrics_[rank]->collectable(), name, labels);
  }

 private:
  std::vector<std::string> addresses_;
  std::vector<Inbox> inboxes_;
  std::vector<std::unique_ptr<PeerMetrics>> metrics_;
  std::vector<PeerIdentity> identities_;
  // Last: transports stop before what they deliver into goes away.
  std::vector<std::unique_ptr<GrpcTransport>> transports_;
};

std::shared_ptr<const codecs::Bytes> Data(codecs::Bytes bytes) {
  return std::make_shared<const codecs::Bytes>(std::move(bytes));
}

absl::Time Soon() { return absl::Now() + absl::Seconds(30); }

TEST(GrpcTransportTest, MessagesOfAnySizeArriveWholeInOrder) {
  Cluster cluster(3);
  for (int r = 0; r < 3; ++r) ASSERT_TRUE(cluster.Start(r).ok());
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(cluster.transport(r).WaitForPeers(Soon()).ok());
  }
  std::string big(3 * 1024 * 1024 + 5, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 7);
  const MessageKey key{"job", "fc1.weight", 12, 1, Phase::kReduceScatter};
  ASSERT_TRUE(cluster.transport(0).Send(2, key, Data(big), Soon()).ok());
  ASSERT_TRUE(cluster.transport(0).Send(2, key, Data(""), Soon()).ok());
  ASSERT_TRUE(cluster.transport(1).Send(2, key, Data("small"), Soon()).ok());
  std::vector<Inbox::Message> got = cluster.inbox(2).WaitMessages(3);
  std::vector<Inbox::Message> from0;
  for (auto& m : got) {
    EXPECT_EQ(m.key, key);
    if (m.from == 0) from0.push_back(m);
    if (m.from == 1) {
      EXPECT_EQ(m.data, "small");
    }
  }
  ASSERT_EQ(from0.size(), 2u);
  EXPECT_TRUE(from0[0].data == big);
  EXPECT_EQ(from0[1].data, "");
  EXPECT_EQ(cluster.Metric(0, "gradcomp_peer_bytes_total",
                           {{"peer", "2"}, {"direction", "sent"}}),
            big.size());
  EXPECT_EQ(cluster.Metric(2, "gradcomp_peer_bytes_total",
                           {{"peer", "0"}, {"direction", "received"}}),
            big.size());
  EXPECT_EQ(cluster.Metric(2, "gradcomp_peers_up", {}), 2);
}

TEST(GrpcTransportTest, AMismatchedPeerIsRefusedNamingBothSides) {
  Cluster cluster(2);
  cluster.identity(1).policy_hash = "other";
  ASSERT_TRUE(cluster.Start(0).ok());
  ASSERT_TRUE(cluster.Start(1).ok());
  const absl::Status status = cluster.transport(0).WaitForPeers(Soon());
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("policy hash"));
  EXPECT_THAT(status.message(), HasSubstr("rank 1"));
  EXPECT_THAT(status.message(), HasSubstr("rank 0"));
}

TEST(GrpcTransportTest, AnAbsentPeerIsNamedAtTheStartupDeadline) {
  Cluster cluster(3);
  ASSERT_TRUE(cluster.Start(0).ok());
  ASSERT_TRUE(cluster.Start(1).ok());
  const absl::Status status =
      cluster.transport(0).WaitForPeers(absl::Now() + absl::Milliseconds(300));
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(status.message(),
              HasSubstr(absl::StrCat("rank 2 (", cluster.address(2), ")")));
  EXPECT_THAT(status.message(), HasSubstr("could not reach 1 of 2 peers"));
}

TEST(GrpcTransportTest, ARestartedPeerIsLostThenRejoins) {
  Cluster cluster(2);
  ASSERT_TRUE(cluster.Start(0).ok());
  ASSERT_TRUE(cluster.Start(1).ok());
  ASSERT_TRUE(cluster.transport(0).WaitForPeers(Soon()).ok());
  cluster.Stop(1);
  EXPECT_THAT(cluster.inbox(0).WaitLost(1).message(), HasSubstr("rank 1"));
  // Queued while rank 1 is away, delivered when it is back.
  const MessageKey key{"job", "w", 1, 0, Phase::kGather};
  ASSERT_TRUE(cluster.transport(0).Send(1, key, Data("hello"), Soon()).ok());
  cluster.identity(1).instance = 99;
  ASSERT_TRUE(cluster.Start(1).ok());
  ASSERT_TRUE(cluster.transport(0).WaitForPeers(Soon()).ok());
  ASSERT_TRUE(cluster.transport(1).WaitForPeers(Soon()).ok());
  std::vector<Inbox::Message> got = cluster.inbox(1).WaitMessages(1);
  EXPECT_EQ(got[0].data, "hello");
  ASSERT_TRUE(cluster.transport(1).Send(0, key, Data("back"), Soon()).ok());
  EXPECT_EQ(cluster.inbox(0).WaitMessages(1)[0].data, "back");
}

}  // namespace
}  // namespace gradcomp::service
