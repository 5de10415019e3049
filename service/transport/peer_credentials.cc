#include "service/transport/peer_credentials.h"

#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_certificate_verifier.h"
#include "grpcpp/security/tls_credentials_options.h"

namespace gradcomp::service {
namespace {

struct TlsFile {
  const char* flag;  // how an operator names it
  const std::string* path;
  const char* pem_kind;  // what "-----BEGIN ...-----" must say
  const char* holds;
};

absl::Status CheckPemFile(const TlsFile& file) {
  std::ifstream in(*file.path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat(
        file.flag, " is '", *file.path, "', which cannot be read; expected a ",
        "readable PEM file holding ", file.holds));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  // The first block's type line: "-----BEGIN CERTIFICATE-----",
  // "-----BEGIN PRIVATE KEY-----", "-----BEGIN EC PRIVATE KEY-----", ...
  const size_t begin = text.find("-----BEGIN ");
  const bool ok = begin != std::string::npos &&
                  absl::StrContains(absl::string_view(text).substr(
                                        begin, text.find('\n', begin) - begin),
                                    absl::StrCat(file.pem_kind, "-----"));
  if (!ok) {
    return absl::InvalidArgumentError(
        absl::StrCat(file.flag, " is '", *file.path, "', which holds no PEM ",
                     file.pem_kind, " block; expected ", file.holds));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckPeerTlsFiles(const PeerTlsFiles& files) {
  if (!files.enabled()) return absl::OkStatus();
  const TlsFile all[] = {
      {"--peer_tls_cert (peer_tls.cert_file)", &files.cert, "CERTIFICATE",
       "this daemon's certificate chain"},
      {"--peer_tls_key (peer_tls.key_file)", &files.key, "PRIVATE KEY",
       "the private key of --peer_tls_cert"},
      {"--peer_tls_ca (peer_tls.ca_file)", &files.ca, "CERTIFICATE",
       "the CA certificate(s) that sign every peer's certificate"},
  };
  const TlsFile* set = nullptr;
  for (const TlsFile& file : all) {
    if (set == nullptr && !file.path->empty()) set = &file;
  }
  for (const TlsFile& file : all) {
    if (file.path->empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(set->flag, " is set but ", file.flag,
                       " is not: peer TLS needs all three of --peer_tls_cert, "
                       "--peer_tls_key and --peer_tls_ca, or none of them"));
    }
  }
  for (const TlsFile& file : all) {
    if (absl::Status pem = CheckPemFile(file); !pem.ok()) return pem;
  }
  if (files.refresh < absl::Seconds(1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the peer TLS refresh interval is ",
        absl::FormatDuration(files.refresh), ", expected at least 1s"));
  }
  return absl::OkStatus();
}

absl::StatusOr<PeerCredentials> MakePeerCredentials(const PeerTlsFiles& files) {
  if (absl::Status checked = CheckPeerTlsFiles(files); !checked.ok()) {
    return checked;
  }
  PeerCredentials credentials;
  if (!files.enabled()) return credentials;
  namespace tls = ::grpc::experimental;
  // One watcher feeds both sides: a replaced file reaches the listener and
  // every new outgoing connection at the same time.
  auto provider = std::make_shared<tls::FileWatcherCertificateProvider>(
      files.key, files.cert, files.ca,
      static_cast<unsigned int>(absl::ToInt64Seconds(files.refresh)));

  tls::TlsServerCredentialsOptions server(provider);
  server.watch_root_certs();
  server.watch_identity_key_cert_pairs();
  server.set_cert_request_type(
      GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  credentials.server = grpc::experimental::TlsServerCredentials(server);

  tls::TlsChannelCredentialsOptions channel;
  channel.set_certificate_provider(provider);
  channel.watch_root_certs();
  channel.watch_identity_key_cert_pairs();
  channel.set_verify_server_certs(true);
  channel.set_certificate_verifier(
      std::make_shared<tls::HostNameCertificateVerifier>());
  credentials.channel = grpc::experimental::TlsCredentials(channel);
  credentials.tls = true;
  return credentials;
}

std::string ConnectFailureHint(const PeerCredentials& credentials) {
  if (!credentials.tls) return "";
  return " over mutual TLS: it is down, or the TLS handshake failed (a "
         "certificate not signed by the other side's --peer_tls_ca, a "
         "certificate that does not name the address dialled, or a plaintext "
         "peer; the 'Handshake failed' line in either daemon's log says which)";
}

}  // namespace gradcomp::service
