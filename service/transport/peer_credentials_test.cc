#include "service/transport/peer_credentials.h"

#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/transport/test_certificates.h"

namespace gradcomp::service {
namespace {

using ::testing::HasSubstr;

std::string TmpDir() { return std::getenv("TEST_TMPDIR"); }

PeerTlsFiles Issued() {
  static PeerTlsFiles* files = [] {
    auto ca = TestCa::Create(TmpDir(), "credentials-ca");
    EXPECT_TRUE(ca.ok()) << ca.status();
    auto issued = ca->Issue("credentials-leaf");
    EXPECT_TRUE(issued.ok()) << issued.status();
    return new PeerTlsFiles(*issued);
  }();
  return *files;
}

TEST(PeerCredentialsTest, NoFilesArePlaintext) {
  const absl::StatusOr<PeerCredentials> credentials =
      MakePeerCredentials(PeerTlsFiles());
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  EXPECT_FALSE(credentials->tls);
}

TEST(PeerCredentialsTest, ThreePemFilesAreMutualTls) {
  const absl::StatusOr<PeerCredentials> credentials =
      MakePeerCredentials(Issued());
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  EXPECT_TRUE(credentials->tls);
  EXPECT_NE(credentials->server, nullptr);
  EXPECT_NE(credentials->channel, nullptr);
}

TEST(PeerCredentialsTest, AMissingFileIsNamedWithTheFlagThatIsSet) {
  PeerTlsFiles files = Issued();
  files.key.clear();
  files.ca.clear();
  const absl::Status status = CheckPeerTlsFiles(files);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              HasSubstr("--peer_tls_cert (peer_tls.cert_file) is set but "
                        "--peer_tls_key (peer_tls.key_file) is not"));

  files = Issued();
  files.ca.clear();
  EXPECT_THAT(CheckPeerTlsFiles(files).message(),
              HasSubstr("--peer_tls_ca (peer_tls.ca_file) is not"));
}

TEST(PeerCredentialsTest, AnUnreadableFileIsNamed) {
  PeerTlsFiles files = Issued();
  files.ca = TmpDir() + "/no-such-ca.crt";
  const absl::Status status = CheckPeerTlsFiles(files);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              HasSubstr(absl::StrCat("--peer_tls_ca (peer_tls.ca_file) is '",
                                     files.ca, "', which cannot be read")));
}

TEST(PeerCredentialsTest, FilesOfTheWrongKindAreRefused) {
  PeerTlsFiles swapped = Issued();
  std::swap(swapped.cert, swapped.key);
  EXPECT_THAT(CheckPeerTlsFiles(swapped).message(),
              HasSubstr("holds no PEM CERTIFICATE block"));

  PeerTlsFiles text = Issued();
  text.key = TmpDir() + "/not-a-key.pem";
  std::ofstream(text.key) << "hello\n";
  const absl::Status status = CheckPeerTlsFiles(text);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              HasSubstr("--peer_tls_key (peer_tls.key_file) is '" + text.key +
                        "', which holds no PEM PRIVATE KEY block"));
}

TEST(PeerCredentialsTest, ARefreshUnderASecondIsRefused) {
  PeerTlsFiles files = Issued();
  files.refresh = absl::Milliseconds(100);
  EXPECT_THAT(CheckPeerTlsFiles(files).message(),
              HasSubstr("refresh interval is 100ms, expected at least 1s"));
}

}  // namespace
}  // namespace gradcomp::service
