// Real gradcompd processes whose peer port runs mutual TLS, with
// certificates made by openssl at test time: peers from the job's CA reduce
// correctly; a peer with a certificate from another CA, or a plaintext peer,
// is refused and named in the error the daemon exits with; a certificate
// replaced on disk lets a refused peer in without a restart; a half-given TLS
// configuration stops the daemon at start with the missing flag named.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/transport/peer_credentials.h"
#include "service/transport/test_certificates.h"
#include "tests/integration/daemon_process.h"

namespace gradcomp::testing {
namespace {

using ::gradcomp::service::PeerTlsFiles;
using ::gradcomp::service::TestCa;
using ::testing::HasSubstr;

constexpr int kWorld = 2;

std::string TmpDir() { return std::getenv("TEST_TMPDIR"); }

std::vector<std::string> TlsArgs(const PeerTlsFiles& files) {
  return {absl::StrCat("--peer_tls_cert=", files.cert),
          absl::StrCat("--peer_tls_key=", files.key),
          absl::StrCat("--peer_tls_ca=", files.ca), "--peer_tls_refresh=1s"};
}

// gradcomp_peers_up on the daemon's /metrics page; -1 if unreadable.
double PeersUp(DaemonProcess& daemon) {
  auto page = HttpGet(daemon.metrics_port(), "/metrics");
  if (!page.ok()) return -1;
  for (absl::string_view line : absl::StrSplit(*page, '\n')) {
    double value = 0;
    if (absl::ConsumePrefix(&line, "gradcomp_peers_up ") &&
        absl::SimpleAtod(line, &value)) {
      return value;
    }
  }
  return -1;
}

class PeerTlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto job = TestCa::Create(TmpDir(), "job-ca");
    ASSERT_TRUE(job.ok()) << job.status();
    auto other = TestCa::Create(TmpDir(), "other-ca");
    ASSERT_TRUE(other.ok()) << other.status();
    job_ca_ = new TestCa(*job);
    other_ca_ = new TestCa(*other);
  }

  void SetUp() override {
    for (int r = 0; r < kWorld; ++r) {
      peers_.push_back(absl::StrCat("127.0.0.1:", *FreePort()));
    }
    daemons_.resize(kWorld);
  }

  // A certificate from `ca` for `leaf`, trusting the job's CA.
  static PeerTlsFiles Files(TestCa& ca, const std::string& leaf) {
    absl::StatusOr<PeerTlsFiles> files = ca.Issue(leaf);
    EXPECT_TRUE(files.ok()) << files.status();
    files->ca = job_ca_->cert();
    return *files;
  }

  absl::Status Start(int rank, std::vector<std::string> args,
                     absl::Duration startup = absl::Seconds(60)) {
    auto binary = DaemonBinary();
    if (!binary.ok()) return binary.status();
    args.insert(
        args.end(),
        {absl::StrCat("--world_size=", kWorld), absl::StrCat("--rank=", rank),
         absl::StrCat("--peers=", absl::StrJoin(peers_, ",")),
         absl::StrCat("--peer_startup_timeout=", absl::FormatDuration(startup)),
         "--collective_timeout=20s"});
    auto daemon = DaemonProcess::Start(*binary, args);
    if (!daemon.ok()) return daemon.status();
    daemons_[rank] = std::move(*daemon);
    return absl::OkStatus();
  }

  absl::Status WaitMeshUp() {
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    for (int r = 0; r < kWorld; ++r) {
      while (PeersUp(*daemons_[r]) != kWorld - 1) {
        if (absl::Now() > deadline) {
          return absl::DeadlineExceededError(absl::StrCat(
              "rank ", r, " never saw its peer; log:\n", daemons_[r]->Log()));
        }
        absl::SleepFor(absl::Milliseconds(50));
      }
    }
    return absl::OkStatus();
  }

  // Until the daemon has exited (it gives up on its peers after --
  // peer_startup_timeout); its log.
  std::string WaitExit(int rank) {
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (daemons_[rank]->Running() && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(50));
    }
    EXPECT_FALSE(daemons_[rank]->Running()) << "rank " << rank;
    return daemons_[rank]->Log();
  }

  // Every rank reduces its own float32 tensor at `step`; each gets the mean.
  void ExpectReduceIsTheMean(int64_t step) {
    constexpr int kNumel = 5000;
    std::vector<std::vector<float>> grads(kWorld);
    std::vector<double> mean(kNumel, 0);
    for (int r = 0; r < kWorld; ++r) {
      for (int i = 0; i < kNumel; ++i) {
        grads[r].push_back(static_cast<float>((r + 1) * 0.25 + i * 1e-3));
        mean[i] += grads[r][i] / kWorld;
      }
    }
    v1::CodecSpec none;
    none.set_name("none");
    std::vector<absl::StatusOr<client::Float32ReduceResult>> results(
        kWorld, absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    for (int r = 0; r < kWorld; ++r) {
      threads.emplace_back([&, r] {
        auto client = daemons_[r]->Connect();
        if (!client.ok()) {
          results[r] = client.status();
          return;
        }
        const int64_t shape[] = {kNumel};
        results[r] = (*client)->Reduce("tls-job", "fc.weight", step, grads[r],
                                       shape, none);
      });
    }
    for (std::thread& t : threads) t.join();
    for (int r = 0; r < kWorld; ++r) {
      ASSERT_TRUE(results[r].ok())
          << "rank " << r << ": " << results[r].status();
      ASSERT_EQ(results[r]->values.size(), static_cast<size_t>(kNumel));
      for (int i = 0; i < kNumel; ++i) {
        ASSERT_NEAR(results[r]->values[i], mean[i], 1e-6) << "element " << i;
      }
    }
  }

  static TestCa* job_ca_;
  static TestCa* other_ca_;
  std::vector<std::string> peers_;
  std::vector<std::unique_ptr<DaemonProcess>> daemons_;
};

TestCa* PeerTlsTest::job_ca_ = nullptr;
TestCa* PeerTlsTest::other_ca_ = nullptr;

TEST_F(PeerTlsTest, PeersWithCertificatesFromTheJobCaReduceCorrectly) {
  ASSERT_TRUE(Start(0, TlsArgs(Files(*job_ca_, "ok0"))).ok());
  ASSERT_TRUE(Start(1, TlsArgs(Files(*job_ca_, "ok1"))).ok());
  ASSERT_TRUE(WaitMeshUp().ok());
  EXPECT_THAT(daemons_[0]->Log(), HasSubstr("peers over mutual TLS"));
  ExpectReduceIsTheMean(0);
  ExpectReduceIsTheMean(1);
}

TEST_F(PeerTlsTest, APeerWithACertificateFromAnotherCaIsRefusedAndNamed) {
  ASSERT_TRUE(
      Start(0, TlsArgs(Files(*job_ca_, "ca0")), absl::Seconds(10)).ok());
  ASSERT_TRUE(
      Start(1, TlsArgs(Files(*other_ca_, "ca1")), absl::Seconds(10)).ok());
  const std::string log = WaitExit(0);
  EXPECT_THAT(log, HasSubstr(absl::StrCat("could not reach 1 of 1 peers before "
                                          "the deadline: rank 1 (",
                                          peers_[1], "): cannot connect to ")));
  EXPECT_THAT(log, HasSubstr("over mutual TLS"));
  // gRPC's own line says why: rank 1's certificate does not verify.
  EXPECT_THAT(log, HasSubstr("certificate verify failed"));
  EXPECT_THAT(WaitExit(1), HasSubstr(absl::StrCat("rank 0 (", peers_[0], ")")));
}

TEST_F(PeerTlsTest, APlaintextPeerIsRefusedAndNamed) {
  ASSERT_TRUE(
      Start(0, TlsArgs(Files(*job_ca_, "pt0")), absl::Seconds(10)).ok());
  ASSERT_TRUE(Start(1, {}, absl::Seconds(10)).ok());
  const std::string log = WaitExit(0);
  EXPECT_THAT(log, HasSubstr(absl::StrCat("could not reach 1 of 1 peers before "
                                          "the deadline: rank 1 (",
                                          peers_[1], ")")));
  // Plaintext bytes where a TLS ClientHello belongs.
  EXPECT_THAT(log, HasSubstr("wrong version number"));
  EXPECT_THAT(WaitExit(1), HasSubstr(absl::StrCat("rank 0 (", peers_[0], ")")));
}

TEST_F(PeerTlsTest, ARotatedCertificateLetsTheRefusedPeerInWithoutARestart) {
  const PeerTlsFiles wrong = Files(*other_ca_, "rot1");
  ASSERT_TRUE(Start(0, TlsArgs(Files(*job_ca_, "rot0"))).ok());
  ASSERT_TRUE(Start(1, TlsArgs(wrong)).ok());
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (!absl::StrContains(daemons_[0]->Log(), "certificate verify failed")) {
    ASSERT_LT(absl::Now(), deadline) << daemons_[0]->Log();
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(PeersUp(*daemons_[0]), 0);

  const PeerTlsFiles right = Files(*job_ca_, "rot1-renewed");
  ASSERT_EQ(std::rename(right.key.c_str(), wrong.key.c_str()), 0);
  ASSERT_EQ(std::rename(right.cert.c_str(), wrong.cert.c_str()), 0);
  ASSERT_TRUE(WaitMeshUp().ok());
  ExpectReduceIsTheMean(0);
}

TEST_F(PeerTlsTest, AHalfGivenTlsConfigStopsTheDaemonNamingTheMissingFlag) {
  const PeerTlsFiles files = Files(*job_ca_, "half0");
  const absl::Status status =
      Start(0, {absl::StrCat("--peer_tls_cert=", files.cert),
                absl::StrCat("--peer_tls_ca=", files.ca)});
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(status.message(),
              HasSubstr("--peer_tls_cert (peer_tls.cert_file) is set but "
                        "--peer_tls_key (peer_tls.key_file) is not"));
}

}  // namespace
}  // namespace gradcomp::testing
