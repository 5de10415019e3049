// The credentials of the peer port: plaintext by default, or mutual TLS from
// three PEM files (this daemon's certificate chain, its private key, and the
// CA that signs every peer's certificate). With TLS, each side proves itself
// to the other: the listener requires and verifies a client certificate, the
// dialler verifies the listener's certificate and its name (the host of the
// peer's address must be in the certificate's subjectAltName). The files are
// watched and re-read every `refresh`, so a rotated certificate is used by the
// next connection without a restart.
//
//   PeerTlsFiles files{"/etc/gradcomp/tls/tls.crt",
//   "/etc/gradcomp/tls/tls.key",
//                      "/etc/gradcomp/tls/ca.crt"};
//   GC_ASSIGN_OR_RETURN(options.credentials, MakePeerCredentials(files));
#ifndef GRADCOMP_SERVICE_TRANSPORT_PEER_CREDENTIALS_H_
#define GRADCOMP_SERVICE_TRANSPORT_PEER_CREDENTIALS_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"

namespace gradcomp::service {

// Paths of PEM files; all empty: plaintext.
struct PeerTlsFiles {
  std::string cert;  // this daemon's certificate (chain), leaf first
  std::string key;   // its private key
  std::string ca;    // the CA bundle peers' certificates must chain to
  // Seconds between checks of the files for a new certificate (gRPC's
  // watcher counts in whole seconds, at least 1).
  absl::Duration refresh = absl::Seconds(60);

  bool enabled() const { return !cert.empty() || !key.empty() || !ca.empty(); }
};

// What the peer server listens with and what the dialler connects with.
struct PeerCredentials {
  std::shared_ptr<grpc::ServerCredentials> server =
      grpc::InsecureServerCredentials();
  std::shared_ptr<grpc::ChannelCredentials> channel =
      grpc::InsecureChannelCredentials();
  bool tls = false;
};

// OK for no files at all, or for three readable files that hold PEM data of
// the right kind; otherwise InvalidArgument naming the file or the flag
// that is missing ("--peer_tls_cert is set but --peer_tls_key is not").
absl::Status CheckPeerTlsFiles(const PeerTlsFiles& files);

// Plaintext credentials for no files, mutual-TLS ones for three; the checks
// of CheckPeerTlsFiles first.
absl::StatusOr<PeerCredentials> MakePeerCredentials(const PeerTlsFiles& files);

// What follows "cannot connect to <peer>": with TLS a refused handshake
// looks like a peer that is down, so it lists the causes; "" for plaintext.
std::string ConnectFailureHint(const PeerCredentials& credentials);

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_TRANSPORT_PEER_CREDENTIALS_H_
