#include "service/transport/grpc_transport.h"

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/crc32c.h"
#include "base/free_port.h"
#include "base/tcp_relay.h"
#include "gmock/gmock.h"
#include "gradcomp/v1/gradcomp.grpc.pb.h"
#include "gradcomp/v1/peer.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "service/metrics/metrics_testing.h"
#include "service/metrics/peer_metrics.h"
#include "service/peers/handshake.h"

namespace gradcomp::service {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;

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
  void OnCorruptMessage(int from, const MessageKey& key,
                        const absl::Status& why) override {
    absl::MutexLock lock(&mu_);
    corrupt_.push_back({from, key, std::string(why.message())});
    corrupt_code_ = why.code();
  }
  // The first `n` damaged messages (their data is the error message), and
  // the status code of the last.
  std::pair<std::vector<Message>, absl::StatusCode> WaitCorrupt(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() { return corrupt_.size() >= n; };
    mu_.Await(absl::Condition(&enough));
    return {corrupt_, corrupt_code_};
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
  // WaitLost, giving up (nullopt) after `timeout`.
  std::optional<absl::Status> WaitLostFor(int rank, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto lost = [&]() {
      return std::find(lost_.begin(), lost_.end(), rank) != lost_.end();
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&lost), timeout)) {
      return std::nullopt;
    }
    return why_;
  }
  // The ranks reported lost so far.
  std::vector<int> Lost() {
    absl::MutexLock lock(&mu_);
    return lost_;
  }

 private:
  absl::Mutex mu_;
  std::vector<Message> messages_;
  std::vector<Message> corrupt_;
  absl::StatusCode corrupt_code_ = absl::StatusCode::kOk;
  std::vector<int> lost_;
  absl::Status why_;
};

class Cluster {
 public:
  explicit Cluster(int world_size) : inboxes_(world_size) {
    for (int r = 0; r < world_size; ++r) {
      addresses_.push_back(
          absl::StrCat("127.0.0.1:", gradcomp::testing::FreePort().value()));
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

  absl::Status Start(int rank, uint64_t max_message_bytes =
                                   GrpcTransportOptions().max_message_bytes) {
    GrpcTransportOptions options;
    options.rank = rank;
    options.max_message_bytes = max_message_bytes;
    options.peers = addresses_;
    options.listen = addresses_[rank];
    for (const auto& [route, address] : routes_) {
      if (route.first == rank) options.peers[route.second] = address;
    }
    options.keepalive_time = keepalive_time_;
    options.keepalive_timeout = keepalive_timeout_;
    options.chunk_bytes = 64 << 10;
    options.tamper_for_test = tamper_;
    options.max_queued_bytes = max_queued_bytes_;
    const PeerIdentity identity = identities_[rank];
    auto transport = GrpcTransport::Create(
        options, [identity] { return identity; }, &inboxes_[rank],
        metrics_[rank].get());
    if (!transport.ok()) return transport.status();
    transports_[rank] = std::move(*transport);
    return transports_[rank]->Start();
  }
  void Stop(int rank) { transports_[rank].reset(); }
  // Transports started after this change their chunks with `tamper`.
  void Tamper(decltype(GrpcTransportOptions::tamper_for_test) tamper) {
    tamper_ = std::move(tamper);
  }

  // Transports started after this queue at most `bytes` for each peer.
  void LimitQueues(uint64_t bytes) { max_queued_bytes_ = bytes; }

  // Transports started after this ping their connections with these.
  void Keepalive(absl::Duration time, absl::Duration timeout) {
    keepalive_time_ = time;
    keepalive_timeout_ = timeout;
  }

  // Rank `rank`, when started after this, dials rank `peer` at `address`
  // (a relay) instead of where `peer` listens.
  void Route(int rank, int peer, std::string address) {
    routes_[{rank, peer}] = std::move(address);
  }

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
  decltype(GrpcTransportOptions::tamper_for_test) tamper_;
  uint64_t max_queued_bytes_ = GrpcTransportOptions().max_queued_bytes;
  absl::Duration keepalive_time_ = GrpcTransportOptions().keepalive_time;
  absl::Duration keepalive_timeout_ = GrpcTransportOptions().keepalive_timeout;
  std::map<std::pair<int, int>, std::string> routes_;
  // Last: transports stop before what they deliver into goes away.
  std::vector<std::unique_ptr<GrpcTransport>> transports_;
};

int Port(const std::string& address) {
  return std::stoi(address.substr(address.rfind(':') + 1));
}

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

// A message over the receiver's limit is dropped unbuffered and fails its
// key there (RESOURCE_EXHAUSTED naming the sender and the tensor), once:
// the stream stays up and carries the next message, and the sender does
// not write the refused one again (ending the stream made it redial and
// resend it until its deadline, failing every other step on the way).
TEST(GrpcTransportTest, AMessageOverTheLimitIsDroppedAndTheStreamGoesOn) {
  Cluster cluster(2);
  ASSERT_TRUE(cluster.Start(0).ok());
  ASSERT_TRUE(cluster.Start(1, /*max_message_bytes=*/1 << 20).ok());
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(cluster.transport(r).WaitForPeers(Soon()).ok());
  }
  const MessageKey key{"job", "fc1.weight", 0, 0, Phase::kGather};
  ASSERT_TRUE(cluster.transport(0)
                  .Send(1, key, Data(std::string(2 << 20, 'x')), Soon())
                  .ok());
  const MessageKey next{"job", "fc2.weight", 0, 0, Phase::kGather};
  ASSERT_TRUE(cluster.transport(0).Send(1, next, Data("small"), Soon()).ok());
  const std::vector<Inbox::Message> got = cluster.inbox(1).WaitMessages(1);
  EXPECT_EQ(got[0].key.tensor, "fc2.weight");
  EXPECT_EQ(got[0].data, "small");
  const auto [corrupt, code] = cluster.inbox(1).WaitCorrupt(1);
  ASSERT_EQ(corrupt.size(), 1u);
  EXPECT_EQ(code, absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(corrupt[0].key.tensor, "fc1.weight");
  EXPECT_THAT(corrupt[0].data,
              HasSubstr("announced a message of 2097152 bytes for job 'job' "
                        "tensor 'fc1.weight' step 0, over the 1048576-byte "
                        "limit"));
  EXPECT_THAT(cluster.inbox(1).Lost(), IsEmpty());
  EXPECT_EQ(cluster.Metric(1, "gradcomp_peers_up", {}), 1);
}

TEST(GrpcTransportTest, AMessageOfSeveralPartsArrivesAsTheirConcatenation) {
  Cluster cluster(2);
  ASSERT_TRUE(cluster.Start(0).ok());
  ASSERT_TRUE(cluster.Start(1).ok());
  ASSERT_TRUE(cluster.transport(0).WaitForPeers(Soon()).ok());
  // Parts that end inside a 64 KiB chunk and span several of them.
  auto a = std::make_shared<std::string>(70000, 'a');
  auto b = std::make_shared<std::string>("header");
  OutgoingMessage message;
  message.parts = {*b, absl::string_view(*a).substr(5), "", *b};
  message.owner = std::make_shared<std::pair<decltype(a), decltype(b)>>(a, b);
  const MessageKey key{"job", "w", 1, 0, Phase::kReduceScatter};
  ASSERT_TRUE(cluster.transport(0)
                  .SendMessage(1, key, std::move(message), Soon())
                  .ok());
  const std::vector<Inbox::Message> got = cluster.inbox(1).WaitMessages(1);
  EXPECT_EQ(got[0].data, "header" + a->substr(5) + "header");
}

// A byte changed after the sender took its checksum: the receiver reports
// the message as damaged (DATA_LOSS naming the sender and the tensor),
// counts it, and the stream carries the next message intact.
TEST(GrpcTransportTest, AChunkChangedInTransitFailsItsMessageLoudly) {
  Cluster cluster(2);
  cluster.Tamper([](int to, const MessageKey& key, std::string* chunk) {
    if (key.tensor == "fc1.weight" && chunk->size() > 100) (*chunk)[100] ^= 1;
  });
  ASSERT_TRUE(cluster.Start(0).ok());
  ASSERT_TRUE(cluster.Start(1).ok());
  ASSERT_TRUE(cluster.transport(0).WaitForPeers(Soon()).ok());
  const MessageKey bad{"job", "fc1.weight", 3, 0, Phase::kGather};
  const MessageKey good{"job", "fc1.bias", 3, 0, Phase::kGather};
  ASSERT_TRUE(cluster.transport(0)
                  .Send(1, bad, Data(std::string(200000, 'x')), Soon())
                  .ok());
  ASSERT_TRUE(cluster.transport(0).Send(1, good, Data("intact"), Soon()).ok());
  const std::vector<Inbox::Message> got = cluster.inbox(1).WaitMessages(1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].key, good);
  EXPECT_EQ(got[0].data, "intact");
  const auto [corrupt, code] = cluster.inbox(1).WaitCorrupt(1);
  ASSERT_EQ(corrupt.size(), 1u);
  EXPECT_EQ(code, absl::StatusCode::kDataLoss);
  EXPECT_EQ(corrupt[0].from, 0);
  EXPECT_EQ(corrupt[0].key, bad);
  EXPECT_THAT(corrupt[0].data,
              HasSubstr(absl::StrCat("from rank 0 (", cluster.address(0),
                                     ") for job 'job' tensor 'fc1.weight' "
                                     "step 3 round 0 failed its checksum")));
  EXPECT_EQ(cluster.Metric(1, "gradcomp_peer_checksum_failures_total",
                           {{"peer", "0"}}),
            1);
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
  // Rank 1 refused rank 0's Hello: its "this daemon" is rank 1.
  EXPECT_THAT(status.message(),
              HasSubstr(absl::StrCat("rank 1 (", cluster.address(1),
                                     ") refused this daemon's handshake, in "
                                     "its words: peer handshake refused")));
}

// Rank 1 is a daemon of another release, alike in every other field (the
// same chart, policy and seed), that holds the address rank 0 dials.
TEST(GrpcTransportTest, ADaemonOfAnotherPeerGroupIsRefused) {
  Cluster cluster(2);
  cluster.identity(0).group = "ns/train-a";
  cluster.identity(1).group = "ns/train-b";
  ASSERT_TRUE(cluster.Start(0).ok());
  ASSERT_TRUE(cluster.Start(1).ok());
  const absl::Status status = cluster.transport(0).WaitForPeers(Soon());
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("the peer group is 'ns/train-"));
}

TEST(GrpcTransportTest, AnAbsentPeerIsNamedAtTheStartupDeadline) {
  Cluster cluster(3);
  ASSERT_TRUE(cluster.Start(0).ok());
  ASSERT_TRUE(cluster.Start(1).ok());
  // Time enough to reach the running rank 1 on a loaded machine.
  const absl::Status status =
      cluster.transport(0).WaitForPeers(absl::Now() + absl::Seconds(5));
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(status.message(),
              HasSubstr(absl::StrCat("rank 2 (", cluster.address(2), ")")));
  EXPECT_THAT(status.message(), HasSubstr("could not reach 1 of 2 peers"));
}

// A --peers entry that is some other gRPC server (a daemon's client
// --listen, say): its UNIMPLEMENTED has no message, so the error says what
// the address is.
TEST(GrpcTransportTest, AServerWithoutThePeerStreamIsNamed) {
  Cluster cluster(2);
  v1::Gradcomp::Service client_api;  // every method UNIMPLEMENTED
  grpc::ServerBuilder builder;
  builder.AddListeningPort(cluster.address(1),
                           grpc::InsecureServerCredentials());
  builder.RegisterService(&client_api);
  const std::unique_ptr<grpc::Server> other = builder.BuildAndStart();
  ASSERT_NE(other, nullptr);
  ASSERT_TRUE(cluster.Start(0).ok());
  const absl::Status status =
      cluster.transport(0).WaitForPeers(absl::Now() + absl::Seconds(3));
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(status.message(),
              HasSubstr(absl::StrCat("rank 1 (", cluster.address(1),
                                     ") answers gRPC but serves no gradcompd "
                                     "peer stream (UNIMPLEMENTED")));
  cluster.Stop(0);
  other->Shutdown();
}

TEST(GrpcTransportTest, ARestartedPeerIsLostThenRejoins) {
  Cluster cluster(2);
  ASSERT_TRUE(cluster.Start(0).ok());
  ASSERT_TRUE(cluster.Start(1).ok());
  ASSERT_TRUE(cluster.transport(0).WaitForPeers(Soon()).ok());
  cluster.Stop(1);
  EXPECT_THAT(cluster.inbox(0).WaitLost(1).message(), HasSubstr("rank 1"));
  // Rank 1's stream to rank 0 is gone; rank 0's to rank 1 may not be known
  // gone yet, and a message written into it now would be lost with it (a
  // dying TCP connection takes the write). Wait until rank 0 says its own
  // stream is down, so that the message below is queued.
  const absl::Time give_up = Soon();
  while (absl::StrContains(
      cluster.transport(0).WaitForPeers(absl::Now()).message(),
      "has not dialled this daemon back")) {
    ASSERT_LT(absl::Now(), give_up) << "rank 0 never saw its stream end";
    absl::SleepFor(absl::Milliseconds(10));
  }
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

// A peer that falls silent without closing its socket (its host lost
// power, a network split): the listening side's own keepalive pings find
// the incoming stream dead and report the peer lost. The dialler's pings
// tell only the dialler; without the listener's, the stream would stay
// open for gRPC's server default of 2 h, and a later loss of that peer's
// next stream would not be reported. Keepalive is shortened to 1 s + 1 s;
// the 30 s bound only keeps a failure from hanging the test.
TEST(GrpcTransportTest, APeerThatFallsSilentIsLostOnTheListeningSide) {
  Cluster cluster(2);
  cluster.Keepalive(absl::Seconds(1), absl::Seconds(1));
  gradcomp::testing::TcpRelay relay(Port(cluster.address(0)));
  ASSERT_TRUE(relay.ok());
  // Rank 0's stream from rank 1 goes through the relay; the one it dials to
  // rank 1 does not.
  cluster.Route(1, 0, relay.address());
  ASSERT_TRUE(cluster.Start(0).ok());
  ASSERT_TRUE(cluster.Start(1).ok());
  ASSERT_TRUE(cluster.transport(0).WaitForPeers(Soon()).ok());
  ASSERT_TRUE(cluster.transport(1).WaitForPeers(Soon()).ok());
  const MessageKey key{"job", "w", 1, 0, Phase::kGather};
  ASSERT_TRUE(cluster.transport(1).Send(0, key, Data("through"), Soon()).ok());
  ASSERT_EQ(cluster.inbox(0).WaitMessages(1)[0].data, "through");

  relay.Freeze();
  const std::optional<absl::Status> why =
      cluster.inbox(0).WaitLostFor(1, absl::Seconds(30));
  ASSERT_TRUE(why.has_value())
      << "rank 0 never noticed that rank 1's stream fell silent";
  EXPECT_THAT(why->message(), HasSubstr("the stream from rank 1"));
}

// A Connect stream dialled by hand into a transport, as rank `id.rank`
// would: for streams the transports would not open themselves.
class HandDialledStream {
 public:
  explicit HandDialledStream(const std::string& address)
      : stub_(v1::Peer::NewStub(
            grpc::CreateChannel(address, grpc::InsecureChannelCredentials()))) {
    context_.set_deadline(std::chrono::system_clock::now() +
                          std::chrono::seconds(30));
    stream_ = stub_->Connect(&context_);
  }
  // Sends `id`'s Hello; true once the listener answered with its own.
  bool Handshake(const PeerIdentity& id) {
    v1::PeerFrame hello;
    hello.mutable_hello()->set_version(id.version);
    hello.mutable_hello()->set_wire_version(id.wire_version);
    hello.mutable_hello()->set_protocol_version(id.protocol_version);
    hello.mutable_hello()->set_world_size(id.world_size);
    hello.mutable_hello()->set_rank(id.rank);
    hello.mutable_hello()->set_policy_hash(id.policy_hash);
    hello.mutable_hello()->set_seed(id.seed);
    hello.mutable_hello()->set_instance(id.instance);
    v1::PeerFrame reply;
    return stream_->Write(hello) && stream_->Read(&reply) && reply.has_hello();
  }
  bool Write(const v1::PeerFrame& frame) { return stream_->Write(frame); }
  // Closes the stream; returns once the listener is done with it (its
  // handler has returned the call's status).
  grpc::Status End() {
    stream_->WritesDone();
    return Ended();
  }
  // Waits, writing nothing more, until the listener ends the stream (or
  // the stream's 30 s deadline passes), and returns the call's status.
  grpc::Status Ended() {
    v1::PeerFrame ignored;
    while (stream_->Read(&ignored)) {
    }
    return stream_->Finish();
  }

 private:
  std::unique_ptr<v1::Peer::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::PeerFrame, v1::PeerFrame>>
      stream_;
};

// A header announcing `total_bytes` for tensor `tensor`, with the first
// chunk `chunk`.
v1::PeerFrame FirstFrame(absl::string_view tensor, uint64_t total_bytes,
                         absl::string_view chunk) {
  v1::PeerFrame frame;
  v1::MessageHeader* header = frame.mutable_header();
  header->set_job("job");
  header->set_tensor(std::string(tensor));
  header->set_step(1);
  header->set_phase(v1::PHASE_GATHER);
  header->set_total_bytes(total_bytes);
  frame.set_chunk(std::string(chunk));
  frame.set_chunk_crc32c(Crc32c(chunk));
  return frame;
}

// Rank 1 restarted and dialled in again while rank 0 still held the stream
// of its old instance (a half-open connection, which rank 0's keepalive
// pings would find dead only ~30 s later). A rank writes over one stream at
// a time, so the new stream ends the old one at once, with the old one's
// unfinished message (before, a peer could open any number of streams and
// hold an unfinished message of up to the per-message limit in each). Rank
// 1 is not reported lost: its messages come over the new stream, and the
// steps waiting for them must not fail. When its last stream ends, it is.
TEST(GrpcTransportTest, ANewStreamFromARankEndsItsOldOneAndLosesNoPeer) {
  Cluster cluster(2);
  ASSERT_TRUE(cluster.Start(0).ok());
  PeerIdentity old_instance = Cluster::Identity(1, 2);
  old_instance.instance = 77;
  HandDialledStream old_stream(cluster.address(0));
  ASSERT_TRUE(old_stream.Handshake(old_instance));
  ASSERT_TRUE(old_stream.Write(FirstFrame("w", 1 << 30, "unfinished")));
  ASSERT_TRUE(cluster.Start(1).ok());
  ASSERT_TRUE(cluster.transport(1).WaitForPeers(Soon()).ok());

  const grpc::Status old_end = old_stream.Ended();
  EXPECT_EQ(old_end.error_code(), grpc::StatusCode::CANCELLED)
      << old_end.error_message();
  const MessageKey key{"job", "w", 1, 0, Phase::kGather};
  ASSERT_TRUE(cluster.transport(1).Send(0, key, Data("new"), Soon()).ok());
  ASSERT_EQ(cluster.inbox(0).WaitMessages(1)[0].data, "new");
  EXPECT_THAT(cluster.inbox(0).Lost(), IsEmpty());

  cluster.Stop(1);
  EXPECT_THAT(cluster.inbox(0).WaitLost(1).message(),
              HasSubstr(absl::StrCat("the stream from rank 1 (",
                                     cluster.address(1), ") ended")));
}

// Only a stream that passed the handshake ends another: a refused one
// (here, of another world size) leaves rank 1's live stream alone.
TEST(GrpcTransportTest, ARefusedStreamEndsNoOtherStream) {
  Cluster cluster(2);
  ASSERT_TRUE(cluster.Start(0).ok());
  ASSERT_TRUE(cluster.Start(1).ok());
  ASSERT_TRUE(cluster.transport(0).WaitForPeers(Soon()).ok());
  ASSERT_TRUE(cluster.transport(1).WaitForPeers(Soon()).ok());
  HandDialledStream refused(cluster.address(0));
  EXPECT_FALSE(refused.Handshake(Cluster::Identity(1, 3)));
  EXPECT_EQ(refused.Ended().error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  const MessageKey key{"job", "w", 1, 0, Phase::kGather};
  ASSERT_TRUE(cluster.transport(1).Send(0, key, Data("still"), Soon()).ok());
  ASSERT_EQ(cluster.inbox(0).WaitMessages(1)[0].data, "still");
  EXPECT_THAT(cluster.inbox(0).Lost(), IsEmpty());
}

// A message header with a phase outside peer.proto's (a broken or newer
// peer) ends the stream as a framing error naming the peer; nothing is
// delivered under a Phase value no collective uses.
TEST(GrpcTransportTest, AMessageOfAnUnknownPhaseEndsTheStream) {
  Cluster cluster(2);
  ASSERT_TRUE(cluster.Start(0).ok());
  HandDialledStream stream(cluster.address(0));
  ASSERT_TRUE(stream.Handshake(Cluster::Identity(1, 2)));
  v1::PeerFrame frame = FirstFrame("w", 1, "x");
  frame.mutable_header()->set_phase(static_cast<v1::Phase>(9));
  ASSERT_TRUE(stream.Write(frame));
  const grpc::Status status = stream.End();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(),
              HasSubstr("sent a message for tensor 'w' with phase 9, "
                        "expected 1..6"));
  EXPECT_THAT(cluster.inbox(0).WaitLost(1).message(), HasSubstr("phase 9"));
  EXPECT_THAT(cluster.inbox(0).WaitMessages(0), IsEmpty());
}

// A name longer than any rank sends ends the stream before the message is
// held (before, a peer could hold megabytes in each message's names).
TEST(GrpcTransportTest, AMessageWithAnOverlongNameEndsTheStream) {
  Cluster cluster(2);
  ASSERT_TRUE(cluster.Start(0).ok());
  HandDialledStream stream(cluster.address(0));
  ASSERT_TRUE(stream.Handshake(Cluster::Identity(1, 2)));
  const v1::PeerFrame frame =
      FirstFrame(std::string(kMaxPeerNameBytes + 1, 't'), 0, "");
  ASSERT_TRUE(stream.Write(frame));
  const grpc::Status status = stream.End();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(
      status.error_message(),
      HasSubstr(absl::StrCat("tensor name ", kMaxPeerNameBytes + 1,
                             ", expected at most ", kMaxPeerNameBytes)));
  EXPECT_THAT(cluster.inbox(0).WaitMessages(0), IsEmpty());
}

// Nothing takes messages off the queue to a peer that is down, so once it
// is full only expiry makes room: a send waiting for room gets it when the
// messages ahead of it expire, not at its own deadline (nor, as before,
// never, with every later send blocking until its deadline).
TEST(GrpcTransportTest, ExpiredMessagesMakeRoomInTheQueueToADeadPeer) {
  Cluster cluster(2);
  cluster.LimitQueues(1000);
  ASSERT_TRUE(cluster.Start(0).ok());  // rank 1 never comes up
  const MessageKey key{"job", "w", 1, 0, Phase::kGather};
  ASSERT_TRUE(cluster.transport(0)
                  .Send(1, key, Data(std::string(1000, 'x')),
                        absl::Now() + absl::Milliseconds(100))
                  .ok());
  // The deadline only bounds the test should the room never come.
  const absl::Status status = cluster.transport(0).Send(
      1, key, Data("next"), absl::Now() + absl::Seconds(10));
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(cluster.Metric(0, "gradcomp_peer_messages_dropped_total",
                           {{"reason", "expired"}}),
            1);
}

// Messages that have not expired keep their room: the send waits for its
// deadline and says why the queue did not drain.
TEST(GrpcTransportTest, ASendToAFullQueueFailsAtItsDeadlineNamingThePeer) {
  Cluster cluster(2);
  cluster.LimitQueues(1000);
  ASSERT_TRUE(cluster.Start(0).ok());  // rank 1 never comes up
  const MessageKey key{"job", "w", 1, 0, Phase::kGather};
  ASSERT_TRUE(cluster.transport(0)
                  .Send(1, key, Data(std::string(1000, 'x')), Soon())
                  .ok());
  const absl::Status status = cluster.transport(0).Send(
      1, key, Data("next"), absl::Now() + absl::Milliseconds(100));
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(
      status.message(),
      HasSubstr(absl::StrCat("the send queue to rank 1 (", cluster.address(1),
                             ") still held 1000 bytes at the "
                             "deadline")));
  EXPECT_THAT(status.message(), HasSubstr("is not connected"));
}

// A round whose collective failed here is withdrawn from the queue to a
// peer that is away: when that peer (a restarted daemon) comes, it gets the
// other rounds' and steps' messages, not the failed round's, which it would
// take in a rerun of that round as this rank's message (docs/peers.md).
TEST(GrpcTransportTest, AWithdrawnRoundIsNotSentToAPeerThatComesLater) {
  Cluster cluster(2);
  ASSERT_TRUE(cluster.Start(0).ok());  // rank 1 comes later
  for (const auto& [step, round, data] :
       {std::tuple<int64_t, int, std::string>{5, 0, "failed round"},
        {5, 1, "next round"},
        {6, 0, "next step"}}) {
    for (const Phase phase : {Phase::kReduceScatter, Phase::kAllgather}) {
      const MessageKey key{"job", "w", step, round, phase};
      ASSERT_TRUE(cluster.transport(0).Send(1, key, Data(data), Soon()).ok());
    }
  }
  const MessageKey other_tensor{"job", "v", 5, 0, Phase::kGather};
  ASSERT_TRUE(
      cluster.transport(0).Send(1, other_tensor, Data("other"), Soon()).ok());
  cluster.transport(0).Withdraw("job", "w", 5, 0);
  EXPECT_EQ(cluster.Metric(0, "gradcomp_peer_messages_dropped_total",
                           {{"reason", "withdrawn"}}),
            2);
  ASSERT_TRUE(cluster.Start(1).ok());
  // In queue order; the withdrawn two came first.
  std::vector<std::string> got;
  for (const Inbox::Message& message : cluster.inbox(1).WaitMessages(5)) {
    got.push_back(message.data);
  }
  EXPECT_THAT(got, ::testing::ElementsAre("next round", "next round",
                                          "next step", "next step", "other"));
}

}  // namespace
}  // namespace gradcomp::service
