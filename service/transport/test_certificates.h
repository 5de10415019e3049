// Certificates for tests, made at test time with the openssl command: a CA,
// and leaf certificates it signs (for 127.0.0.1 and localhost unless told
// otherwise) that serve as both TLS server and client. Nothing here is fit for
// production keys.
//
//   GC_ASSIGN_OR_RETURN(TestCa ca, TestCa::Create(dir, "job-ca"));
//   GC_ASSIGN_OR_RETURN(PeerTlsFiles rank0, ca.Issue("rank0"));
#ifndef GRADCOMP_SERVICE_TRANSPORT_TEST_CERTIFICATES_H_
#define GRADCOMP_SERVICE_TRANSPORT_TEST_CERTIFICATES_H_

#include <string>

#include "absl/status/statusor.h"
#include "service/transport/peer_credentials.h"

namespace gradcomp::service {

class TestCa {
 public:
  // A self-signed CA in `dir`/`name`.crt and .key (`dir` must exist).
  static absl::StatusOr<TestCa> Create(const std::string& dir,
                                       const std::string& name);

  // A fresh key and a certificate for `leaf` signed by this CA, naming
  // `names` (an openssl subjectAltName value), in `dir`/`leaf`.crt and .key;
  // the files' `ca` is this CA's certificate.
  absl::StatusOr<PeerTlsFiles> Issue(
      const std::string& leaf,
      const std::string& names = "IP:127.0.0.1,DNS:localhost");

  const std::string& cert() const { return cert_; }

 private:
  TestCa(std::string dir, std::string name);

  std::string dir_;
  std::string name_;
  std::string cert_;
  std::string key_;
  int serial_ = 1;
};

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_TRANSPORT_TEST_CERTIFICATES_H_
