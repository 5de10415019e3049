// The Transport between daemons over gRPC (peer.proto): this daemon serves
// the Peer service on its listen address and dials every other rank, one
// long-lived Connect stream per direction. Messages are cut into chunks
// (1 MiB by default) so that no message limit applies; gRPC's HTTP/2 window
// and a bounded queue per peer are the backpressure. Each chunk carries its
// CRC-32C: one that does not match fails the message's collective on the
// receiving rank with DATA_LOSS (Receiver::OnCorruptMessage). Chunks go out
// of the messages' own memory, unserialised. A broken stream is
// redialled with backoff, and the Hello handshake runs again, so a peer
// that restarts rejoins by itself.
//
//   GC_ASSIGN_OR_RETURN(auto transport, GrpcTransport::Create(options,
//                       identity_fn, &mailbox, &peer_metrics));
//   GC_RETURN_IF_ERROR(transport->Start());
//   GC_RETURN_IF_ERROR(transport->WaitForPeers(absl::Now() + timeout));
#ifndef GRADCOMP_SERVICE_TRANSPORT_GRPC_TRANSPORT_H_
#define GRADCOMP_SERVICE_TRANSPORT_GRPC_TRANSPORT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "service/metrics/peer_metrics.h"
#include "service/peers/handshake.h"
#include "service/transport/peer_credentials.h"
#include "service/transport/transport.h"

namespace gradcomp::service {

struct GrpcTransportOptions {
  int rank = 0;
  std::vector<std::string> peers;  // host:port of every rank, by rank
  std::string listen;              // this daemon's Peer service address
  size_t chunk_bytes = size_t{1} << 20;
  // Bytes queued for one peer before Send blocks.
  uint64_t max_queued_bytes = uint64_t{256} << 20;
  // Largest message a peer may announce; a larger one ends its stream
  // before any of it is buffered.
  uint64_t max_message_bytes = uint64_t{16} << 30;
  absl::Duration min_backoff = absl::Milliseconds(50);
  absl::Duration max_backoff = absl::Seconds(1);
  // Keepalive pings on every peer connection, those this daemon dials and
  // those it serves: a peer that vanishes without closing its socket (host
  // down, network split) is noticed within about keepalive_time +
  // keepalive_timeout on both sides. Every rank should use the same values:
  // the listener takes pings more often than every keepalive_time / 2 for
  // abuse (docs/peers.md says why the timeout is not shorter).
  absl::Duration keepalive_time = absl::Seconds(10);
  absl::Duration keepalive_timeout = absl::Seconds(20);
  // For tests of the checksums: called with each chunk's bytes after their
  // CRC-32C is taken and before they are written, so that a change it makes
  // reaches the peer as damage in transit would.
  std::function<void(int to, const MessageKey& key, std::string* chunk)>
      tamper_for_test;
  // Plaintext unless set (MakePeerCredentials): both the listener and the
  // dialler use them, so a TLS daemon and a plaintext one never connect.
  PeerCredentials credentials;
};

class GrpcTransport : public Transport {
 public:
  // `identity` gives this daemon's Hello (read at every handshake, so a
  // policy changed at run time is what a reconnecting peer is checked
  // against). `receiver` and `metrics` (may be null) must outlive the
  // transport. Nothing runs until Start.
  static absl::StatusOr<std::unique_ptr<GrpcTransport>> Create(
      GrpcTransportOptions options, std::function<PeerIdentity()> identity,
      Receiver* receiver, PeerMetrics* metrics);

  // Stops dialling, cancels the streams and shuts the server down.
  ~GrpcTransport() override;

  // Serves the Peer service and starts dialling the other ranks.
  // Unavailable if the listen address cannot be bound.
  absl::Status Start();

  // Waits until every other rank is connected both ways (handshaken). On
  // the deadline, Unavailable naming each missing rank and its last error;
  // a handshake refusal (a mismatch) is returned at once.
  absl::Status WaitForPeers(absl::Time deadline);
  // Ends a WaitForPeers now (with Cancelled), for a daemon told to stop.
  void StopWaiting();

  int rank() const override;
  int world_size() const override;
  std::string PeerName(int rank) const override;
  absl::Status SendMessage(int to, const MessageKey& key,
                           OutgoingMessage message,
                           absl::Time deadline) override;
  // Counted in gradcomp_peer_messages_dropped_total{reason="withdrawn"}.
  void Withdraw(absl::string_view job, absl::string_view tensor, int64_t step,
                int round) override;

 private:
  class Impl;
  explicit GrpcTransport(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_TRANSPORT_GRPC_TRANSPORT_H_
