#include "service/transport/grpc_transport.h"

#include <algorithm>
#include <cstdio>
#include <deque>
#include <limits>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "base/crc32c.h"
#include "base/start_thread.h"
#include "base/status_macros.h"
#include "codecs/wire.h"
#include "gradcomp/v1/peer.pb.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/impl/rpc_method.h"
#include "grpcpp/impl/rpc_service_method.h"
#include "grpcpp/support/method_handler.h"
#include "service/transport/peer_frame.h"

namespace gradcomp::service {
namespace {

namespace v1 = ::gradcomp::v1;

v1::Hello ToProto(const PeerIdentity& id) {
  v1::Hello hello;
  hello.set_version(id.version);
  hello.set_wire_version(id.wire_version);
  hello.set_protocol_version(id.protocol_version);
  hello.set_world_size(static_cast<uint32_t>(id.world_size));
  hello.set_rank(static_cast<uint32_t>(id.rank));
  hello.set_policy_hash(id.policy_hash);
  hello.set_seed(id.seed);
  hello.set_instance(id.instance);
  hello.set_group(id.group);
  return hello;
}

PeerIdentity FromProto(const v1::Hello& hello) {
  PeerIdentity id;
  id.version = hello.version();
  id.wire_version = hello.wire_version();
  id.protocol_version = hello.protocol_version();
  id.world_size = static_cast<int>(hello.world_size());
  id.rank = static_cast<int>(hello.rank());
  id.policy_hash = hello.policy_hash();
  id.seed = hello.seed();
  id.instance = hello.instance();
  id.group = hello.group();
  return id;
}

absl::Status FromGrpc(const grpc::Status& status) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

int Milliseconds(absl::Duration d) {
  return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(d),
                                            std::numeric_limits<int>::max()));
}

// Keepalive on one end of the peer connections, the dialling (a channel) or
// the listening one (the server): both ping, so that each side notices on
// its own a peer that vanished without closing its socket (host down,
// network split), within about keepalive_time + keepalive_timeout (~30 s by
// default). The listener needs its own pings: the dialler's only tell the
// dialler, and without them a vanished peer's incoming stream would stay
// open for gRPC's server default of 2 h, counted live, so that the loss of
// that peer's next stream would not be reported. The timeout is gRPC's
// default, 20 s, not shorter: a ping's ack waits behind the data in flight
// on the same connection and behind the peer's event loop, and a busy peer
// on a loaded host must not have its stream closed mid-step (with 5 s that
// happened under load; docs/peers.md). The collective deadline, not
// keepalive, is what bounds a step.
template <typename SetInt>
void SetKeepalive(const GrpcTransportOptions& options, SetInt set) {
  set(GRPC_ARG_KEEPALIVE_TIME_MS, Milliseconds(options.keepalive_time));
  set(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, Milliseconds(options.keepalive_timeout));
  set(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // Pings go on while a stream is idle (gRPC stops after 2 without data).
  set(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // The other side's keepalive pings, at the same interval, must not be
  // taken for abuse (the margin is for timer jitter).
  set(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
      Milliseconds(options.keepalive_time / 2));
}

grpc::ChannelArguments ChannelArgs(const GrpcTransportOptions& options) {
  grpc::ChannelArguments args;
  SetKeepalive(options, [&args](const char* name, int value) {
    args.SetInt(name, value);
  });
  // Reconnect to a restarted peer quickly; gRPC's default starts at 1 s.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  return args;
}

// peer.proto's one method. The streams carry raw byte buffers (PeerFrame's
// encoding, peer_frame.h) so that chunks go out of and into the messages'
// own memory; the method is registered by hand as the generated code does.
constexpr char kConnectMethod[] = "/gradcomp.v1.Peer/Connect";

using ServerStream =
    grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>;
using ClientStream =
    grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>;

struct Queued {
  MessageKey key;
  OutgoingMessage message;
  uint64_t size = 0;
  absl::Time deadline;
  // Its collective failed here (Withdraw) while a writer held it: dropped
  // should that writer's stream break before the message is through.
  bool withdrawn = false;
};

}  // namespace

class GrpcTransport::Impl final : public grpc::Service {
 public:
  Impl(GrpcTransportOptions options, std::function<PeerIdentity()> identity,
       Receiver* receiver, PeerMetrics* metrics)
      : options_(std::move(options)),
        identity_(std::move(identity)),
        receiver_(receiver),
        metrics_(metrics),
        peers_(options_.peers.size()) {
    AddMethod(new grpc::internal::RpcServiceMethod(
        kConnectMethod, grpc::internal::RpcMethod::BIDI_STREAMING,
        new grpc::internal::BidiStreamingHandler<Impl, grpc::ByteBuffer,
                                                 grpc::ByteBuffer>(
            [](Impl* impl, grpc::ServerContext* context, ServerStream* stream) {
              return impl->Connect(context, stream);
            },
            this)));
  }

  ~Impl() override { Stop(); }

  int rank() const { return options_.rank; }
  int world_size() const { return static_cast<int>(options_.peers.size()); }
  std::string PeerName(int r) const {
    return absl::StrCat("rank ", r, " (", options_.peers[r], ")");
  }

  absl::Status Start() {
    grpc::ServerBuilder builder;
    builder.AddListeningPort(options_.listen, options_.credentials.server);
    builder.RegisterService(this);
    SetKeepalive(options_, [&builder](const char* name, int value) {
      builder.AddChannelArgument(name, value);
    });
    // As for the client API: a taken port must fail, not be shared.
    builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
    server_ = builder.BuildAndStart();
    if (server_ == nullptr) {
      return absl::UnavailableError(absl::StrCat(
          "cannot serve the peer service on '", options_.listen, "' (rank ",
          rank(), "): the address is invalid or already in use"));
    }
    for (int r = 0; r < world_size(); ++r) {
      if (r == rank()) continue;
      peers_[r].dialer = std::thread([this, r] { Dial(r); });
    }
    return absl::OkStatus();
  }

  void Stop() ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      stopping_ = true;
      for (Peer& peer : peers_) {
        if (peer.context != nullptr) peer.context->TryCancel();
      }
    }
    if (server_ != nullptr) {
      server_->Shutdown(std::chrono::system_clock::now() +
                        std::chrono::milliseconds(100));
    }
    for (Peer& peer : peers_) {
      if (peer.dialer.joinable()) peer.dialer.join();
    }
    if (server_ != nullptr) server_->Wait();
  }

  absl::Status WaitForPeers(absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto settled = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      bool all_up = true;
      for (int r = 0; r < world_size(); ++r) {
        if (r == rank()) continue;
        if (peers_[r].refused) return true;
        all_up = all_up && Up(r);
      }
      return all_up || stopping_ || stop_waiting_;
    };
    mu_.AwaitWithDeadline(absl::Condition(&settled), deadline);
    if (stop_waiting_) {
      return absl::CancelledError(
          absl::StrCat("rank ", rank(), " stopped waiting for its peers"));
    }
    std::vector<std::string> missing;
    for (int r = 0; r < world_size(); ++r) {
      if (r == rank()) continue;
      if (peers_[r].refused) return peers_[r].last_error;
      if (Up(r)) continue;
      std::string why = peers_[r].last_error.ok()
                            ? "not connected yet"
                            : std::string(peers_[r].last_error.message());
      if (peers_[r].outgoing_up && peers_[r].incoming == 0) {
        why = "it has not dialled this daemon back";
      }
      missing.push_back(absl::StrCat(PeerName(r), ": ", why));
    }
    if (missing.empty()) return absl::OkStatus();
    return absl::UnavailableError(absl::StrCat(
        "rank ", rank(), " could not reach ", missing.size(), " of ",
        world_size() - 1,
        " peers before the deadline: ", absl::StrJoin(missing, "; ")));
  }

  void StopWaiting() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    stop_waiting_ = true;
  }

  absl::Status Send(int to, const MessageKey& key, OutgoingMessage message,
                    absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_) {
    if (to < 0 || to >= world_size() || to == rank()) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", rank(), " cannot send to rank ", to,
                       ", expected another rank in [0, ", world_size(), ")"));
    }
    const uint64_t size = message.size();
    absl::MutexLock lock(&mu_);
    const absl::Status room = AwaitRoomLocked(to, size, deadline);
    if (!room.ok()) return room;
    Peer& peer = peers_[to];
    peer.queue.push_back({key, std::move(message), size, deadline});
    peer.queued_bytes += size;
    return absl::OkStatus();
  }

  void Withdraw(absl::string_view job, absl::string_view tensor, int64_t step,
                int round) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    for (int to = 0; to < world_size(); ++to) {
      if (to == rank()) continue;
      Peer& peer = peers_[to];
      for (auto it = peer.queue.begin(); it != peer.queue.end();) {
        const MessageKey& key = it->key;
        if (key.step != step || key.round != round || key.tensor != tensor ||
            key.job != job) {
          ++it;
          continue;
        }
        // While connected a writer may hold the front (it pops it once
        // written): marked, and dropped if that write does not get through.
        if (peer.outgoing_up && it == peer.queue.begin()) {
          it->withdrawn = true;
          ++it;
          continue;
        }
        peer.queued_bytes -= it->size;
        it = peer.queue.erase(it);
        if (metrics_ != nullptr) metrics_->CountDropped("withdrawn");
      }
    }
  }

  // The listening side of one peer's stream: handshake, then messages.
  grpc::Status Connect(grpc::ServerContext* context, ServerStream* stream) {
    grpc::ByteBuffer first;
    absl::StatusOr<ReceivedFrame> frame;
    if (stream->Read(&first)) frame = ParseFrame(first);
    if (!frame.ok() || !frame->hello.has_value()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "peer stream: expected a Hello as the first frame");
    }
    const PeerIdentity remote = FromProto(*frame->hello);
    const PeerIdentity local = identity_();
    const absl::Status accepted =
        CheckPeer(local, remote, std::nullopt, context->peer());
    if (!accepted.ok()) {
      std::fprintf(stderr, "gradcompd: %s\n",
                   std::string(accepted.message()).c_str());
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          std::string(accepted.message()));
    }
    if (!stream->Write(HelloFrame(ToProto(local)))) return grpc::Status::OK;
    const int from = remote.rank;
    BeginIncoming(from, context);
    const absl::Status ended = Receive(from, stream);
    if (EndIncoming(from, context)) {
      receiver_->OnPeerLost(
          from, absl::UnavailableError(absl::StrCat(
                    "the stream from ", PeerName(from), " ended: ",
                    ended.ok() ? "connection closed" : ended.message())));
    }
    if (!ended.ok()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          std::string(ended.message()));
    }
    return grpc::Status::OK;
  }

 private:
  struct Peer {
    std::deque<Queued> queue;
    uint64_t queued_bytes = 0;
    bool outgoing_up = false;
    int incoming = 0;  // live streams from this peer
    // Of the newest incoming stream, until it ends or a newer one ends it.
    grpc::ServerContext* incoming_context = nullptr;
    bool refused = false;
    absl::Status last_error;
    grpc::ClientContext* context = nullptr;  // of the live outgoing stream
    std::thread dialer;
  };

  bool Up(int r) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return peers_[r].outgoing_up && peers_[r].incoming > 0;
  }

  void UpdatePeersUpLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (metrics_ == nullptr) return;
    int up = 0;
    for (int r = 0; r < world_size(); ++r) up += r != rank() && Up(r);
    metrics_->SetPeersUp(up);
  }

  // Counts a stream from rank `from` that passed the handshake, and ends
  // the one before it. A rank writes to this daemon over one stream at a
  // time (its Dial loop), so an older stream still open here is one its
  // writer has given up (a restarted daemon's, or one broken by a network
  // split that this side's keepalive has not noticed yet): nothing more
  // comes over it, and its unfinished message, up to the per-message limit,
  // would be held until keepalive ended it. Ending it bounds what a peer
  // holds here to one unfinished message per rank (docs/security.md).
  void BeginIncoming(int from, grpc::ServerContext* context)
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    Peer& peer = peers_[from];
    if (peer.incoming_context != nullptr) {
      std::fprintf(stderr,
                   "gradcompd: a new stream from %s ends its older one\n",
                   PeerName(from).c_str());
      peer.incoming_context->TryCancel();
    }
    peer.incoming_context = context;
    ++peer.incoming;
    UpdatePeersUpLocked();
  }

  // Counts off one ended stream from rank `from`; true if that rank is now
  // lost: no other stream from it is live, and the transport is not
  // stopping. A stream ended by a newer one (BeginIncoming) leaves that one
  // live: the messages still to come from the rank arrive over it, and the
  // steps waiting for them must not fail.
  bool EndIncoming(int from, grpc::ServerContext* context)
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    Peer& peer = peers_[from];
    if (peer.incoming_context == context) peer.incoming_context = nullptr;
    const int live = --peer.incoming;
    UpdatePeersUpLocked();
    return live == 0 && !stopping_;
  }

  // Waits until rank `to`'s queue has room for `size` more bytes (an empty
  // queue always has). While the peer is not connected no writer takes
  // messages off the queue, so room can appear only by messages expiring:
  // they are dropped here, and the wait wakes when the next one expires
  // (a full queue to a dead peer would otherwise stay full for good, and
  // every send to it would block until its deadline). DeadlineExceeded
  // naming the peer if no room came by `deadline`; Cancelled on shutdown.
  absl::Status AwaitRoomLocked(int to, uint64_t size, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Peer& peer = peers_[to];
    auto has_room = [this, &peer, size]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return peer.queued_bytes == 0 ||
             peer.queued_bytes + size <= options_.max_queued_bytes;
    };
    while (true) {
      const bool connected = peer.outgoing_up;
      absl::Time wake = deadline;
      if (!connected) wake = std::min(wake, DropExpiredLocked(&peer));
      // Connecting or disconnecting changes who frees room: look again.
      auto settled = [this, &peer, &has_room,
                      connected]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || has_room() || peer.outgoing_up != connected;
      };
      const bool woken = mu_.AwaitWithDeadline(absl::Condition(&settled), wake);
      if (stopping_) {
        return absl::CancelledError(
            absl::StrCat("rank ", rank(), " is shutting down"));
      }
      if (has_room()) return absl::OkStatus();
      if (!woken && absl::Now() >= deadline) break;
    }
    return absl::DeadlineExceededError(absl::StrCat(
        "the send queue to ", PeerName(to), " still held ", peer.queued_bytes,
        " bytes at the deadline; ", PeerName(to), " is ",
        peer.outgoing_up
            ? "connected but slow"
            : absl::StrCat("not connected: ", peer.last_error.message())));
  }

  // Drops the messages in `peer`'s queue whose deadline has passed, and
  // returns the earliest deadline of those left (InfiniteFuture if none).
  // Only while the peer is not connected: then no writer holds the front.
  absl::Time DropExpiredLocked(Peer* peer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const absl::Time now = absl::Now();
    absl::Time earliest = absl::InfiniteFuture();
    for (auto it = peer->queue.begin(); it != peer->queue.end();) {
      if (it->deadline >= now) {
        earliest = std::min(earliest, it->deadline);
        ++it;
        continue;
      }
      peer->queued_bytes -= it->size;
      it = peer->queue.erase(it);
      if (metrics_ != nullptr) metrics_->CountDropped("expired");
    }
    return earliest;
  }

  // Reassembles messages from their chunks until the stream ends; an error
  // for a stream that breaks the framing rules. A chunk whose CRC-32C does
  // not match spoils its message: the rest of it is read and dropped, and
  // the receiver is told (the stream itself stays up).
  absl::Status Receive(int from, ServerStream* stream) {
    grpc::ByteBuffer raw;
    MessageKey key;
    codecs::Bytes buffer;
    uint64_t total = 0;
    uint64_t received = 0;
    bool in_message = false;
    absl::Status damaged;
    while (stream->Read(&raw)) {
      absl::StatusOr<ReceivedFrame> frame = ParseFrame(raw);
      if (!frame.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(PeerName(from), ": ", frame.status().message()));
      }
      if (frame->header.has_value()) {
        if (in_message) {
          return absl::InvalidArgumentError(absl::StrCat(
              PeerName(from), " started a message before the last one's ",
              total, " bytes had come (", received, " did)"));
        }
        const v1::MessageHeader& h = *frame->header;
        // An unknown phase (a newer or broken peer) would match no
        // collective's key, and the cast below would make it a Phase value
        // the mailbox cannot name.
        if (h.phase() < v1::PHASE_GATHER || h.phase() > v1::PHASE_NEIGHBOURS) {
          return absl::InvalidArgumentError(absl::StrCat(
              PeerName(from), " sent a message for tensor '", h.tensor(),
              "' with phase ", static_cast<int>(h.phase()), ", expected 1..6"));
        }
        if (h.job().size() > kMaxPeerNameBytes ||
            h.tensor().size() > kMaxPeerNameBytes) {
          return absl::InvalidArgumentError(absl::StrCat(
              PeerName(from), " sent a message whose job name has ",
              h.job().size(), " bytes and tensor name ", h.tensor().size(),
              ", expected at most ", kMaxPeerNameBytes, " each"));
        }
        key = MessageKey{h.job(), h.tensor(), h.step(),
                         static_cast<int>(h.round()),
                         static_cast<Phase>(h.phase())};
        total = h.total_bytes();
        buffer.clear();
        received = 0;
        damaged = absl::OkStatus();
        in_message = true;
        // Limits: checked before any of it is buffered (docs/daemon.md). A
        // message over the limit is read and dropped, as a damaged one is,
        // and fails its collective here: ending the stream instead would
        // have the sender write it again after every redial until its
        // deadline, failing every other step on the way.
        if (total > options_.max_message_bytes) {
          damaged = absl::ResourceExhaustedError(absl::StrCat(
              PeerName(from), " announced a message of ", total,
              " bytes for job '", key.job, "' tensor '", key.tensor, "' step ",
              key.step, ", over the ", options_.max_message_bytes,
              "-byte limit on peer messages (gradcompd --max_tensor_bytes "
              "sets it); the message was dropped"));
        } else {
          buffer.reserve(std::min<uint64_t>(total, uint64_t{256} << 20));
          // A message of a large tensor's slice lands in fresh heap in the
          // first steps: 2 MiB pages fault 512 times less often.
          codecs::AdviseHugePages(buffer.data(), buffer.capacity());
        }
      } else if (!in_message) {
        return absl::InvalidArgumentError(absl::StrCat(
            PeerName(from), " sent a chunk outside of any message"));
      }
      const uint64_t n = frame->chunk_size;
      if (metrics_ != nullptr) {
        metrics_->AddBytes(from, Direction::kReceived, n);
      }
      if (received + n > total) {
        return absl::InvalidArgumentError(
            absl::StrCat(PeerName(from), " sent more than the ", total,
                         " bytes its message header announced"));
      }
      uint32_t crc = 0;
      for (absl::string_view piece : frame->chunk) {
        crc = Crc32cExtend(crc, piece.data(), piece.size());
      }
      if (damaged.ok() && crc != frame->chunk_crc32c) {
        damaged = absl::DataLossError(absl::StrCat(
            "the message from ", PeerName(from), " for job '", key.job,
            "' tensor '", key.tensor, "' step ", key.step, " round ", key.round,
            " failed its checksum: bytes [", received, ", ", received + n,
            ") of ", total, " have CRC-32C 0x", absl::Hex(crc, absl::kZeroPad8),
            " but were sent with 0x",
            absl::Hex(frame->chunk_crc32c, absl::kZeroPad8),
            "; expected the bytes rank ", from,
            " sent (they changed in transit or in memory)"));
        if (metrics_ != nullptr) metrics_->CountChecksumFailure(from);
        buffer = codecs::Bytes();
      }
      if (damaged.ok()) {
        for (absl::string_view piece : frame->chunk)
          buffer.append(piece.data(), piece.size());
      }
      received += n;
      if (received == total) {
        if (damaged.ok()) {
          receiver_->OnMessage(from, key, std::move(buffer));
        } else {
          std::fprintf(stderr, "gradcompd: %s\n",
                       std::string(damaged.message()).c_str());
          receiver_->OnCorruptMessage(from, key, damaged);
        }
        buffer = codecs::Bytes();
        in_message = false;
      }
    }
    return absl::OkStatus();
  }

  // Keeps a stream to rank `to` open for as long as the transport runs.
  void Dial(int to) ABSL_LOCKS_EXCLUDED(mu_) {
    auto channel = grpc::CreateCustomChannel(options_.peers[to],
                                             options_.credentials.channel,
                                             ChannelArgs(options_));
    const grpc::internal::RpcMethod connect(
        kConnectMethod, grpc::internal::RpcMethod::BIDI_STREAMING, channel);
    absl::Duration backoff = options_.min_backoff;
    bool logged_error = false;
    while (true) {
      bool was_up = false;
      const absl::Status ended = Stream(to, channel.get(), connect, &was_up);
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      peers_[to].last_error = ended;
      // Between attempts nothing else may look at the queue for a long
      // while: the payloads of messages nobody will take are freed here.
      DropExpiredLocked(&peers_[to]);
      if (was_up || !logged_error) {
        std::fprintf(stderr, "gradcompd: rank %d -> %s: %s\n", rank(),
                     PeerName(to).c_str(),
                     std::string(ended.message()).c_str());
        logged_error = !was_up;
      }
      backoff = was_up ? options_.min_backoff
                       : std::min(backoff * 2, options_.max_backoff);
      auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_;
      };
      mu_.AwaitWithTimeout(absl::Condition(&stopping), backoff);
      if (stopping_) return;
    }
  }

  // One outgoing stream's life: connect, handshake, send until it breaks.
  absl::Status Stream(int to, grpc::Channel* channel,
                      const grpc::internal::RpcMethod& connect, bool* was_up)
      ABSL_LOCKS_EXCLUDED(mu_) {
    if (!channel->WaitForConnected(std::chrono::system_clock::now() +
                                   std::chrono::seconds(1))) {
      return absl::UnavailableError(
          absl::StrCat("cannot connect to ", PeerName(to),
                       ConnectFailureHint(options_.credentials)));
    }
    grpc::ClientContext context;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return absl::CancelledError("shutting down");
      peers_[to].context = &context;
    }
    std::unique_ptr<ClientStream> stream(
        grpc::internal::ClientReaderWriterFactory<
            grpc::ByteBuffer, grpc::ByteBuffer>::Create(channel, connect,
                                                        &context));
    const PeerIdentity local = identity_();
    grpc::ByteBuffer raw_reply;
    absl::StatusOr<ReceivedFrame> reply;
    const bool answered =
        stream->Write(HelloFrame(ToProto(local))) && stream->Read(&raw_reply) &&
        (reply = ParseFrame(raw_reply)).ok() && reply->hello.has_value();
    absl::Status status;
    if (!answered) {
      // The call is over (a refusal carries the listener's reason).
      status = FromGrpc(stream->Finish());
      if (status.ok()) {
        status = absl::UnavailableError(
            absl::StrCat(PeerName(to), " closed the stream in the handshake"));
      } else if (status.code() == absl::StatusCode::kFailedPrecondition) {
        // The listener's reason, where "this daemon" is the listener.
        status = absl::FailedPreconditionError(
            absl::StrCat(PeerName(to), " refused this daemon's handshake, in ",
                         "its words: ", status.message()));
      } else if (status.code() == absl::StatusCode::kUnimplemented) {
        // gRPC's answer for an unknown method carries no message.
        const std::string answer =
            status.message().empty()
                ? "UNIMPLEMENTED"
                : absl::StrCat("UNIMPLEMENTED: ", status.message());
        status = absl::UnavailableError(absl::StrCat(
            PeerName(to), " answers gRPC but serves no gradcompd peer stream (",
            answer, "); expected --peers entry ", to,
            " to be that rank's peer endpoint, not its client --listen "
            "address or another service"));
      }
    } else {
      status =
          CheckPeer(local, FromProto(*reply->hello), to, options_.peers[to]);
      if (status.ok()) {
        *was_up = true;
        status = SendQueued(to, stream.get());
      }
      context.TryCancel();
      stream->Finish();
    }
    absl::MutexLock lock(&mu_);
    peers_[to].context = nullptr;
    peers_[to].outgoing_up = false;
    // Published with `refused` in one critical section: WaitForPeers wakes on
    // `refused` and returns `last_error`, which must already be the reason.
    peers_[to].refused = status.code() == absl::StatusCode::kFailedPrecondition;
    peers_[to].last_error = status;
    UpdatePeersUpLocked();
    return status;
  }

  // Writes queued messages to `stream` until it breaks or the transport
  // stops. A reader thread notices a stream that ends while idle.
  absl::Status SendQueued(int to, ClientStream* stream)
      ABSL_LOCKS_EXCLUDED(mu_) {
    Peer& peer = peers_[to];
    bool broken = false;
    // Without a thread to start, the stream ends and Dial tries again.
    GC_ASSIGN_OR_RETURN(std::thread reader,
                        StartThread(
                            [this, stream, &broken] {
                              grpc::ByteBuffer ignored;
                              while (stream->Read(&ignored)) {
                              }
                              absl::MutexLock lock(&mu_);
                              broken = true;
                            },
                            "the reader of a peer stream"));
    {
      absl::MutexLock lock(&mu_);
      peer.outgoing_up = true;
      peer.refused = false;
      peer.last_error = absl::OkStatus();
      UpdatePeersUpLocked();
    }
    std::fprintf(stderr, "gradcompd: rank %d -> %s: connected\n", rank(),
                 PeerName(to).c_str());
    absl::Status status;
    while (status.ok()) {
      Queued next;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this, &peer, &broken]()
                         ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                           return stopping_ || broken || !peer.queue.empty();
                         };
        mu_.Await(absl::Condition(&ready));
        if (stopping_) break;
        if (broken) {
          status = absl::UnavailableError(
              absl::StrCat("the stream to ", PeerName(to), " closed"));
          break;
        }
        next = peer.queue.front();
      }
      // A message whose collective is over on this side is not worth sending;
      // one cut off by a broken stream stays queued and goes again whole,
      // unless its collective failed here meanwhile.
      const bool expired = absl::Now() > next.deadline;
      if (!expired && !next.withdrawn && !WriteMessage(to, next, stream)) {
        status = absl::UnavailableError(
            absl::StrCat("writing to ", PeerName(to), " failed"));
        break;
      }
      absl::MutexLock lock(&mu_);
      peer.queued_bytes -= next.size;
      peer.queue.pop_front();
      if (metrics_ != nullptr) {
        if (expired) {
          metrics_->CountDropped("expired");
        } else if (next.withdrawn) {
          metrics_->CountDropped("withdrawn");
        }
      }
    }
    {
      absl::MutexLock lock(&mu_);
      peer.context->TryCancel();
    }
    reader.join();
    return status.ok() ? absl::CancelledError("shutting down") : status;
  }

  // Writes `queued` as chunks of at most chunk_bytes, each with its
  // CRC-32C (computed once for all the peers the message goes to); the
  // chunks are slices of the message's own parts, not copies.
  bool WriteMessage(int to, const Queued& queued, ClientStream* stream) {
    const OutgoingMessage& message = queued.message;
    v1::MessageHeader header;
    header.set_job(queued.key.job);
    header.set_tensor(queued.key.tensor);
    header.set_step(queued.key.step);
    header.set_round(static_cast<uint32_t>(queued.key.round));
    header.set_phase(static_cast<v1::Phase>(queued.key.phase));
    header.set_total_bytes(queued.size);
    size_t part = 0;
    size_t offset = 0;  // into parts[part]
    uint64_t sent = 0;
    size_t chunk = 0;
    std::vector<absl::string_view> pieces;
    do {
      pieces.clear();
      uint64_t n = 0;
      while (n < options_.chunk_bytes && part < message.parts.size()) {
        const absl::string_view piece =
            message.parts[part].substr(offset, options_.chunk_bytes - n);
        if (!piece.empty()) pieces.push_back(piece);
        n += piece.size();
        offset += piece.size();
        if (offset == message.parts[part].size()) {
          ++part;
          offset = 0;
        }
      }
      const uint32_t crc = message.checksums->Of(chunk++, pieces);
      const v1::MessageHeader* first = sent == 0 ? &header : nullptr;
      grpc::ByteBuffer frame;
      if (options_.tamper_for_test) {
        auto copy = std::make_shared<std::string>();
        for (absl::string_view piece : pieces)
          copy->append(piece.data(), piece.size());
        options_.tamper_for_test(to, queued.key, copy.get());
        const absl::string_view tampered = *copy;
        frame = DataFrame(first, {&tampered, 1}, crc, std::move(copy));
      } else {
        frame = DataFrame(first, pieces, crc, message.owner);
      }
      if (!stream->Write(frame)) return false;
      if (metrics_ != nullptr) metrics_->AddBytes(to, Direction::kSent, n);
      sent += n;
    } while (sent < queued.size);
    return true;
  }

  const GrpcTransportOptions options_;
  const std::function<PeerIdentity()> identity_;
  Receiver* const receiver_;
  PeerMetrics* const metrics_;
  std::unique_ptr<grpc::Server> server_;

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_waiting_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<Peer> peers_;  // by rank; fields guarded by mu_ except dialer
};

absl::StatusOr<std::unique_ptr<GrpcTransport>> GrpcTransport::Create(
    GrpcTransportOptions options, std::function<PeerIdentity()> identity,
    Receiver* receiver, PeerMetrics* metrics) {
  const int w = static_cast<int>(options.peers.size());
  if (options.rank < 0 || options.rank >= w) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", options.rank, " is not in [0, ", w,
                     "): expected one --peers address per rank"));
  }
  if (options.chunk_bytes == 0) {
    return absl::InvalidArgumentError("chunk_bytes is 0, expected > 0");
  }
  if (options.keepalive_time < absl::Milliseconds(1) ||
      options.keepalive_timeout < absl::Milliseconds(1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "keepalive_time is ", absl::FormatDuration(options.keepalive_time),
        " and keepalive_timeout ",
        absl::FormatDuration(options.keepalive_timeout),
        ", expected both at least 1ms (gRPC counts in milliseconds)"));
  }
  if (options.listen.empty()) options.listen = options.peers[options.rank];
  return std::unique_ptr<GrpcTransport>(
      new GrpcTransport(std::make_unique<Impl>(
          std::move(options), std::move(identity), receiver, metrics)));
}

GrpcTransport::GrpcTransport(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}
GrpcTransport::~GrpcTransport() = default;

absl::Status GrpcTransport::Start() { return impl_->Start(); }
absl::Status GrpcTransport::WaitForPeers(absl::Time deadline) {
  return impl_->WaitForPeers(deadline);
}
void GrpcTransport::StopWaiting() { impl_->StopWaiting(); }
int GrpcTransport::rank() const { return impl_->rank(); }
int GrpcTransport::world_size() const { return impl_->world_size(); }
std::string GrpcTransport::PeerName(int rank) const {
  return impl_->PeerName(rank);
}
absl::Status GrpcTransport::SendMessage(int to, const MessageKey& key,
                                        OutgoingMessage message,
                                        absl::Time deadline) {
  return impl_->Send(to, key, std::move(message), deadline);
}

void GrpcTransport::Withdraw(absl::string_view job, absl::string_view tensor,
                             int64_t step, int round) {
  impl_->Withdraw(job, tensor, step, round);
}

}  // namespace gradcomp::service
