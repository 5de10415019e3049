// GrpcTransport over mutual TLS with certificates made by openssl at test
// time: peers with certificates from the job's CA exchange messages; a
// certificate from another CA, no certificate, or plaintext is refused at
// the TLS handshake, before any Hello; a certificate replaced on disk is
// used by the next connection without a restart.

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/free_port.h"
#include "gmock/gmock.h"
#include "gradcomp/v1/peer.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"
#include "gtest/gtest.h"
#include "service/peers/handshake.h"
#include "service/transport/grpc_transport.h"
#include "service/transport/peer_credentials.h"
#include "service/transport/test_certificates.h"

namespace gradcomp::service {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string TmpDir() { return std::getenv("TEST_TMPDIR"); }

class Inbox : public Receiver {
 public:
  void OnMessage(int from, const MessageKey& key, codecs::Bytes data) override {
    absl::MutexLock lock(&mu_);
    messages_.push_back(std::move(data));
  }
  void OnPeerLost(int rank, const absl::Status& why) override {}
  void OnCorruptMessage(int from, const MessageKey& key,
                        const absl::Status& why) override {}
  std::string WaitMessage() {
    absl::MutexLock lock(&mu_);
    auto any = [&]() { return !messages_.empty(); };
    mu_.Await(absl::Condition(&any));
    return messages_.front();
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> messages_;
};

// Two ranks on loopback, each with the credentials a test gives it.
class Pair {
 public:
  Pair() {
    for (int r = 0; r < 2; ++r) {
      addresses_.push_back(
          absl::StrCat("127.0.0.1:", gradcomp::testing::FreePort().value()));
    }
  }
  ~Pair() {
    for (auto& transport : transports_) transport.reset();
  }

  absl::Status Start(int rank, const PeerCredentials& credentials) {
    GrpcTransportOptions options;
    options.rank = rank;
    options.peers = addresses_;
    options.credentials = credentials;
    PeerIdentity identity;
    identity.version = "test";
    identity.wire_version = 1;
    identity.world_size = 2;
    identity.rank = rank;
    identity.policy_hash = "p";
    identity.instance = rank + 1;
    auto transport = GrpcTransport::Create(
        options, [identity] { return identity; }, &inboxes_[rank], nullptr);
    if (!transport.ok()) return transport.status();
    transports_[rank] = std::move(*transport);
    return transports_[rank]->Start();
  }

  GrpcTransport& transport(int rank) { return *transports_[rank]; }
  Inbox& inbox(int rank) { return inboxes_[rank]; }
  const std::string& address(int rank) const { return addresses_[rank]; }

 private:
  std::vector<std::string> addresses_;
  Inbox inboxes_[2];
  std::unique_ptr<GrpcTransport> transports_[2];
};

class GrpcTransportTlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto job = TestCa::Create(TmpDir(), "job-ca");
    ASSERT_TRUE(job.ok()) << job.status();
    auto other = TestCa::Create(TmpDir(), "other-ca");
    ASSERT_TRUE(other.ok()) << other.status();
    job_ca_ = new TestCa(*job);
    other_ca_ = new TestCa(*other);
  }

  // A certificate and key from `ca`, trusting the job's CA.
  static PeerTlsFiles Files(TestCa& ca, const std::string& leaf) {
    absl::StatusOr<PeerTlsFiles> files = ca.Issue(leaf);
    EXPECT_TRUE(files.ok()) << files.status();
    files->ca = job_ca_->cert();
    files->refresh = absl::Seconds(1);
    return *files;
  }

  static PeerCredentials Credentials(const PeerTlsFiles& files) {
    absl::StatusOr<PeerCredentials> credentials = MakePeerCredentials(files);
    EXPECT_TRUE(credentials.ok()) << credentials.status();
    return *credentials;
  }

  static TestCa* job_ca_;
  static TestCa* other_ca_;
};

TestCa* GrpcTransportTlsTest::job_ca_ = nullptr;
TestCa* GrpcTransportTlsTest::other_ca_ = nullptr;

absl::Time Soon() { return absl::Now() + absl::Seconds(30); }
// Long enough for several dial attempts, each of which is refused.
absl::Time AFewAttempts() { return absl::Now() + absl::Seconds(3); }

TEST_F(GrpcTransportTlsTest, PeersWithCertificatesFromTheJobCaExchange) {
  Pair pair;
  ASSERT_TRUE(pair.Start(0, Credentials(Files(*job_ca_, "a0"))).ok());
  ASSERT_TRUE(pair.Start(1, Credentials(Files(*job_ca_, "a1"))).ok());
  ASSERT_TRUE(pair.transport(0).WaitForPeers(Soon()).ok());
  ASSERT_TRUE(pair.transport(1).WaitForPeers(Soon()).ok());
  const MessageKey key{"job", "w", 1, 0, Phase::kGather};
  ASSERT_TRUE(
      pair.transport(0)
          .Send(1, key, std::make_shared<const codecs::Bytes>("sealed"), Soon())
          .ok());
  EXPECT_EQ(pair.inbox(1).WaitMessage(), "sealed");
}

TEST_F(GrpcTransportTlsTest, APeerWithACertificateFromAnotherCaIsRefused) {
  Pair pair;
  ASSERT_TRUE(pair.Start(0, Credentials(Files(*job_ca_, "b0"))).ok());
  ASSERT_TRUE(pair.Start(1, Credentials(Files(*other_ca_, "b1"))).ok());
  const absl::Status status = pair.transport(0).WaitForPeers(AFewAttempts());
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(status.message(),
              HasSubstr(absl::StrCat("rank 1 (", pair.address(1), ")")));
  EXPECT_THAT(status.message(), HasSubstr("over mutual TLS"));
  const absl::Status other = pair.transport(1).WaitForPeers(AFewAttempts());
  EXPECT_EQ(other.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(other.message(),
              HasSubstr(absl::StrCat("rank 0 (", pair.address(0), ")")));
}

// The dialler checks that the listener's certificate names the address it
// dialled; the listener checks only the chain (a client has no address).
TEST_F(GrpcTransportTlsTest, ACertificateThatDoesNotNameThePeerIsRefused) {
  Pair pair;
  ASSERT_TRUE(pair.Start(0, Credentials(Files(*job_ca_, "n0"))).ok());
  absl::StatusOr<PeerTlsFiles> elsewhere =
      job_ca_->Issue("n1", "DNS:elsewhere.example");
  ASSERT_TRUE(elsewhere.ok()) << elsewhere.status();
  elsewhere->refresh = absl::Seconds(1);
  ASSERT_TRUE(pair.Start(1, Credentials(*elsewhere)).ok());
  const absl::Status status = pair.transport(0).WaitForPeers(AFewAttempts());
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(status.message(),
              HasSubstr(absl::StrCat("rank 1 (", pair.address(1), ")")));
}

TEST_F(GrpcTransportTlsTest, APlaintextPeerIsRefused) {
  Pair pair;
  ASSERT_TRUE(pair.Start(0, Credentials(Files(*job_ca_, "c0"))).ok());
  ASSERT_TRUE(pair.Start(1, PeerCredentials()).ok());
  const absl::Status status = pair.transport(0).WaitForPeers(AFewAttempts());
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(status.message(),
              HasSubstr(absl::StrCat("rank 1 (", pair.address(1), ")")));
  const absl::Status other = pair.transport(1).WaitForPeers(AFewAttempts());
  EXPECT_EQ(other.code(), absl::StatusCode::kUnavailable);
}

// Dials rank 0's peer port with `credentials` and opens a Connect stream
// without a Hello: the call's status says how far it got.
grpc::Status Knock(const std::string& address,
                   std::shared_ptr<grpc::ChannelCredentials> credentials) {
  auto stub = v1::Peer::NewStub(grpc::CreateChannel(address, credentials));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
  auto stream = stub->Connect(&context);
  stream->WritesDone();
  v1::PeerFrame ignored;
  while (stream->Read(&ignored)) {
  }
  return stream->Finish();
}

std::shared_ptr<grpc::ChannelCredentials> TlsWithoutCertificate(
    const std::string& ca) {
  namespace tls = ::grpc::experimental;
  tls::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(
      std::make_shared<tls::FileWatcherCertificateProvider>(ca, 1));
  options.watch_root_certs();
  return tls::TlsCredentials(options);
}

TEST_F(GrpcTransportTlsTest, AClientWithoutACertificateNeverReachesTheHello) {
  Pair pair;
  const PeerTlsFiles files = Files(*job_ca_, "d0");
  ASSERT_TRUE(pair.Start(0, Credentials(files)).ok());
  // A peer with a certificate gets as far as the Hello check.
  const grpc::Status with =
      Knock(pair.address(0), Credentials(Files(*job_ca_, "d1")).channel);
  EXPECT_EQ(with.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(with.error_message(), HasSubstr("expected a Hello"));

  const grpc::Status without =
      Knock(pair.address(0), TlsWithoutCertificate(files.ca));
  EXPECT_EQ(without.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(without.error_message(), Not(HasSubstr("Hello")));

  const grpc::Status plaintext =
      Knock(pair.address(0), grpc::InsecureChannelCredentials());
  EXPECT_EQ(plaintext.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(plaintext.error_message(), Not(HasSubstr("Hello")));
}

// The files are replaced while both ranks run: the next connection after
// the watcher's refresh (1 s) uses the new certificate.
TEST_F(GrpcTransportTlsTest, ARotatedCertificateIsUsedWithoutARestart) {
  Pair pair;
  const PeerTlsFiles wrong = Files(*other_ca_, "e1");
  ASSERT_TRUE(pair.Start(0, Credentials(Files(*job_ca_, "e0"))).ok());
  ASSERT_TRUE(pair.Start(1, Credentials(wrong)).ok());
  ASSERT_EQ(pair.transport(0).WaitForPeers(AFewAttempts()).code(),
            absl::StatusCode::kUnavailable);

  const PeerTlsFiles right = Files(*job_ca_, "e1-rotated");
  ASSERT_EQ(std::rename(right.key.c_str(), wrong.key.c_str()), 0);
  ASSERT_EQ(std::rename(right.cert.c_str(), wrong.cert.c_str()), 0);
  const absl::Status zero = pair.transport(0).WaitForPeers(Soon());
  EXPECT_TRUE(zero.ok()) << zero;
  const absl::Status one = pair.transport(1).WaitForPeers(Soon());
  EXPECT_TRUE(one.ok()) << one;
}

}  // namespace
}  // namespace gradcomp::service
