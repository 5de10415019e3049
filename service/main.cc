// gradcompd: the gradient-compression sidecar daemon. Flags and wiring only;
// everything it runs lives in service/{config,engine,api,metrics,
// collective,transport,peers,shm}.
//
//   gradcompd --listen=127.0.0.1:50051 --metrics_listen=127.0.0.1:9464
//             --config=/etc/gradcomp/daemon.json
//   gradcompd --config=daemon.json --check_config   # validate, print, exit
//   gradcompd --rank=1 --world_size=4
//   --peers=h0:50052,h1:50052,h2:50052,h3:50052
#include <link.h>
#include <malloc.h>
#include <signal.h>
#include <sys/auxv.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "base/utf8.h"
#include "codecs/builtin.h"
#include "codecs/state.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "service/api/authenticated_service.h"
#include "service/api/client_auth.h"
#include "service/api/gradcomp_service.h"
#include "service/api/server.h"
#include "service/api/unix_socket.h"
#include "service/collective/local_collective.h"
#include "service/collective/mailbox.h"
#include "service/collective/peer_collective.h"
#include "service/config/config.h"
#include "service/config/policy_proto.h"
#include "service/engine/engine.h"
#include "service/memory/shared_memory_registry.h"
#include "service/metrics/metrics.h"
#include "service/metrics/metrics_server.h"
#include "service/metrics/peer_metrics.h"
#include "service/peers/handshake.h"
#include "service/transport/grpc_transport.h"
#include "service/transport/peer_credentials.h"
#include "service/version.h"

ABSL_FLAG(std::string, listen, gradcomp::service::kDefaultListen,
          "Client API address: unix:/path/to.sock (the socket's mode decides "
          "who may connect), or host:port (beyond loopback it needs "
          "--client_token_file or --allow_unauthenticated_tcp).");
ABSL_FLAG(std::string, socket_mode, gradcomp::service::kDefaultSocketMode,
          "Octal permissions of the --listen unix socket: its owner and group "
          "decide who may call the client API.");
ABSL_FLAG(std::string, client_token_file, "",
          "File holding the bearer token TCP clients must send as "
          "'authorization: Bearer <token>' (docs/security.md, Client access); "
          "unix-socket clients need none.");
ABSL_FLAG(bool, allow_unauthenticated_tcp, false,
          "Serve TCP clients beyond loopback without a token (only where "
          "something else guards the port).");
ABSL_FLAG(std::string, health_listen, "",
          "host:port of a second gRPC server that answers grpc.health.v1 "
          "only, for kubelet gRPC probes beside a unix-socket --listen.");
ABSL_FLAG(std::string, shm_prefix, gradcomp::service::kDefaultShmPrefix,
          "Shared-memory objects a client may register must be named with "
          "this prefix (the gradcomp helpers use /gradcomp.).");
ABSL_FLAG(std::vector<std::string>, shm_owner_uids, {},
          "Uids, besides the daemon's own, whose shared-memory objects a "
          "client may register (comma-separated); others are refused.");
ABSL_FLAG(std::string, metrics_listen, gradcomp::service::kDefaultMetricsListen,
          "Prometheus /metrics address (host:port); empty turns metrics off.");
ABSL_FLAG(std::string, config, "",
          "DaemonConfig file (gradcomp/v1/config.proto), protobuf JSON or text "
          "format; flags given on the command line override its fields.");
ABSL_FLAG(uint32_t, rank, 0, "This worker's rank in [0, world_size).");
ABSL_FLAG(uint32_t, world_size, 1, "Workers per job; above 1 needs --peers.");
ABSL_FLAG(std::vector<std::string>, peers, {},
          "Comma-separated host:port of every rank's peer endpoint, by rank "
          "(the same list on every daemon).");
ABSL_FLAG(std::string, peer_listen, "",
          "Address this daemon serves the Peer service on; empty: "
          "peers[rank]. Use 0.0.0.0:<port> when peers[rank] is a name that "
          "resolves to this host.");
ABSL_FLAG(std::string, peer_group, "",
          "A name every daemon of this job shares (the Helm chart gives "
          "<namespace>/<fullname>); the peer handshake refuses a daemon of "
          "another group, such as one reached at an address another job's "
          "pod held before. Empty is a group too: it meets only daemons "
          "without one.");
ABSL_FLAG(std::string, peer_tls_cert, "",
          "PEM certificate chain this daemon shows its peers; with "
          "--peer_tls_key and --peer_tls_ca it turns on mutual TLS on the "
          "peer port (docs/security.md).");
ABSL_FLAG(std::string, peer_tls_key, "", "PEM private key of --peer_tls_cert.");
ABSL_FLAG(std::string, peer_tls_ca, "",
          "PEM CA bundle every peer's certificate must chain to.");
ABSL_FLAG(absl::Duration, peer_tls_refresh, absl::Seconds(60),
          "How often the peer TLS files are checked for a rotated "
          "certificate (at least 1s); new connections use the new one.");
ABSL_FLAG(absl::Duration, collective_timeout, absl::Seconds(60),
          "Deadline of one collective: how long a reduce waits for the other "
          "ranks before failing with an error naming the missing ones.");
ABSL_FLAG(absl::Duration, stream_stall_timeout, absl::Minutes(2),
          "A stream whose client makes no progress for this long (a "
          "ReduceStream or ExportStateStream whose client takes nothing, an "
          "ImportStateStream whose client sends no bytes) is cancelled, and "
          "the memory it held is freed.");
ABSL_FLAG(absl::Duration, peer_startup_timeout, absl::Minutes(5),
          "How long a starting daemon retries reaching every peer (names that "
          "do not resolve yet, daemons not up yet) before it exits.");
ABSL_FLAG(uint64_t, peer_buffer_bytes, uint64_t{1} << 30,
          "Bytes of peer messages held for tensors this rank has not reached "
          "yet; beyond it they are dropped and their reduce fails.");
ABSL_FLAG(uint64_t, seed, 0,
          "Job seed of the codecs' random streams; the same on every rank.");
ABSL_FLAG(double, error_sample_rate, 0.1,
          "Fraction of reduces whose relative compression error (and "
          "error-feedback residual norm) is measured for the metrics: one "
          "extra decode of this worker's own payload each; in [0, 1]. The "
          "first reduce is always measured.");
ABSL_FLAG(bool, allow_client_shm, false,
          "Accept client shared-memory regions (RegisterSystemSharedMemory "
          "and Reduce slices). Needs /dev/shm shared with the clients.");
ABSL_FLAG(uint64_t, max_tensor_bytes, uint64_t{4} << 30,
          "Largest tensor a reduce accepts, in bytes of its dtype.");
ABSL_FLAG(uint64_t, memory_budget_bytes, 0,
          "Bytes that in-flight reduces and codec state may hold together "
          "(docs/daemon.md, Limits); 0 (the default): the config file's "
          "value, else half of the memory this process may use (physical, "
          "or its cgroup's limit).");
ABSL_FLAG(absl::Duration, memory_wait, absl::Seconds(10),
          "How long a reduce waits for room in the memory budget before it "
          "fails with RESOURCE_EXHAUSTED.");
ABSL_FLAG(uint64_t, max_concurrent_jobs, 16,
          "Jobs that may reduce at the same time on this daemon.");
ABSL_FLAG(uint64_t, max_tensors_per_job, 65536,
          "Distinct tensor names one job may reduce on this daemon.");
ABSL_FLAG(uint64_t, max_state_bytes_per_job, 0,
          "Codec state bytes beyond which a job may add no new tensor; 0: no "
          "cap but the memory budget.");
ABSL_FLAG(uint64_t, max_queued_requests, 4096,
          "ReduceStream tensors that may wait for a worker, over all streams; "
          "beyond it the stream with the most waiting has a tensor answered "
          "RESOURCE_EXHAUSTED.");
ABSL_FLAG(uint64_t, max_rpc_threads, 1024,
          "Threads gRPC may use to serve client calls (one waits for new "
          "calls; each ReduceStream holds one); a call beyond them is "
          "refused at once with RESOURCE_EXHAUSTED. Also the most threads "
          "of the ReduceStream pool, whose tensors waiting on their peers "
          "or batches each hold one. At least 2.");
ABSL_FLAG(bool, check_config, false,
          "Validate the config and policy, print the effective config as "
          "JSON, and exit 0 (valid) or 1 (invalid) without serving.");

namespace gradcomp::service {
namespace {

// The flag names written on the command line ("--name", "--name=value",
// "-name", and "--noname" for a boolean flag, named as "name"); this absl
// version keeps IsSpecifiedOnCommandLine private, and a flag given with its
// default value must still override the config file.
std::set<std::string> NamedFlags(int argc, char** argv) {
  std::set<std::string> names;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (!absl::ConsumePrefix(&arg, "-")) continue;
    absl::ConsumePrefix(&arg, "-");
    absl::string_view name = arg.substr(0, arg.find('='));
    if (absl::string_view negated = name;
        absl::FindCommandLineFlag(name) == nullptr &&
        absl::ConsumePrefix(&negated, "no")) {
      const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(negated);
      if (flag != nullptr && flag->IsOfType<bool>()) name = negated;
    }
    names.emplace(name);
  }
  return names;
}

// Flags read from a file or the environment are set without being written
// on the command line, so NamedFlags cannot tell them from defaults: beside
// a config file they would be silently overruled by it.
absl::Status CheckNoIndirectFlags(const std::set<std::string>& named,
                                  const std::string& config_path) {
  if (config_path.empty()) return absl::OkStatus();
  for (const char* indirect : {"flagfile", "fromenv", "tryfromenv"}) {
    if (named.count(indirect) > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", indirect,
          " cannot be combined with --config: its flags "
          "could not override the config file; write them on the command "
          "line or in the config file"));
    }
  }
  return absl::OkStatus();
}

template <typename T>
std::optional<T> IfNamed(const std::set<std::string>& named,
                         const absl::Flag<T>& flag, const std::string& name) {
  if (named.count(name) == 0) return std::nullopt;
  return absl::GetFlag(flag);
}

FlagOverrides GivenFlags(const std::set<std::string>& named) {
  FlagOverrides flags;
  flags.listen = IfNamed(named, FLAGS_listen, "listen");
  flags.metrics_listen = IfNamed(named, FLAGS_metrics_listen, "metrics_listen");
  flags.rank = IfNamed(named, FLAGS_rank, "rank");
  flags.world_size = IfNamed(named, FLAGS_world_size, "world_size");
  flags.peers = IfNamed(named, FLAGS_peers, "peers");
  flags.seed = IfNamed(named, FLAGS_seed, "seed");
  flags.allow_client_shm =
      IfNamed(named, FLAGS_allow_client_shm, "allow_client_shm");
  flags.error_sample_rate =
      IfNamed(named, FLAGS_error_sample_rate, "error_sample_rate");
  flags.max_tensor_bytes =
      IfNamed(named, FLAGS_max_tensor_bytes, "max_tensor_bytes");
  flags.memory_budget_bytes =
      IfNamed(named, FLAGS_memory_budget_bytes, "memory_budget_bytes");
  if (auto wait = IfNamed(named, FLAGS_memory_wait, "memory_wait")) {
    flags.memory_wait_seconds = absl::ToDoubleSeconds(*wait);
  }
  flags.max_concurrent_jobs =
      IfNamed(named, FLAGS_max_concurrent_jobs, "max_concurrent_jobs");
  flags.max_tensors_per_job =
      IfNamed(named, FLAGS_max_tensors_per_job, "max_tensors_per_job");
  flags.max_state_bytes_per_job =
      IfNamed(named, FLAGS_max_state_bytes_per_job, "max_state_bytes_per_job");
  flags.max_queued_requests =
      IfNamed(named, FLAGS_max_queued_requests, "max_queued_requests");
  flags.max_rpc_threads =
      IfNamed(named, FLAGS_max_rpc_threads, "max_rpc_threads");
  flags.peer_tls_cert = IfNamed(named, FLAGS_peer_tls_cert, "peer_tls_cert");
  flags.peer_tls_key = IfNamed(named, FLAGS_peer_tls_key, "peer_tls_key");
  flags.peer_tls_ca = IfNamed(named, FLAGS_peer_tls_ca, "peer_tls_ca");
  return flags;
}

// What GetInfo reports: the effective config and the settings that only
// flags carry (the config file has no field for them).
DaemonSettings Settings(const v1::DaemonConfig& config) {
  DaemonSettings settings;
  settings.config_json = ConfigToJson(config);
  for (const char* name :
       {"collective_timeout", "peer_startup_timeout", "peer_buffer_bytes",
        "peer_listen", "peer_tls_refresh", "stream_stall_timeout"}) {
    settings.flags[name] = absl::FindCommandLineFlag(name)->CurrentValue();
  }
  settings.transports = {config.world_size() > 1 ? "grpc" : "local"};
  return settings;
}

// The largest message the client API receives: a tensor of
// max_tensor_bytes plus 1 MiB for the rest of its request (names, shape,
// codec), within gRPC's ceiling of 2 GiB - 1.
int MaxReceiveBytes(uint64_t max_tensor_bytes) {
  constexpr uint64_t kCeiling = std::numeric_limits<int>::max();
  return static_cast<int>(
      std::min(kCeiling, std::min(kCeiling, max_tensor_bytes) + (1 << 20)));
}

// The largest message a peer may send: a payload of a tensor of
// max_tensor_bytes holds at most 8 bytes (top-k's value and index) per
// element of at least 2 bytes, plus 1 MiB of headers; a tensor list
// (DeclareTensors) may take a whole gRPC message.
uint64_t PeerMessageLimit(uint64_t max_tensor_bytes) {
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  const uint64_t payload =
      max_tensor_bytes > (kMax >> 3) ? kMax : 4 * max_tensor_bytes + (1 << 20);
  return std::max<uint64_t>(payload, std::numeric_limits<int>::max());
}

// "host:0" names the port the kernel picked, so a log reader can connect.
std::string BoundAddress(const std::string& listen, int port) {
  if (absl::StartsWith(listen, "unix:")) return listen;
  return absl::StrCat(listen.substr(0, listen.rfind(':')), ":", port);
}

// Blocks SIGINT and SIGTERM in this thread and every thread it starts, so
// that WaitForShutdownSignal receives them synchronously.
sigset_t BlockShutdownSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

int WaitForShutdownSignal(const sigset_t& signals) {
  int signal = 0;
  sigwait(&signals, &signal);
  return signal;
}

// ParseCommandLine hands back what is not a flag, after the program's
// name. A boolean flag takes its value after '=' only, so
// "--allow_unauthenticated_tcp false" sets it to true and leaves "false"
// here: refused, as is any other stray word.
absl::Status CheckNoArguments(absl::Span<char* const> positional) {
  if (positional.size() <= 1) return absl::OkStatus();
  const std::vector<std::string> words(positional.begin() + 1,
                                       positional.end());
  return absl::InvalidArgumentError(absl::StrCat(
      "unexpected argument", words.size() > 1 ? "s" : "", " '",
      absl::StrJoin(words, "' '"),
      "': gradcompd takes flags only, each value after '=' (a boolean flag "
      "followed by a separate 'false' reads as true: write --flag=false)"));
}

// The flags that are not DaemonConfig fields, checked before
// --check_config answers, so that it passes only what would start.
absl::Status CheckFlagValues() {
  const std::pair<const char*, absl::Duration> durations[] = {
      {"--collective_timeout", absl::GetFlag(FLAGS_collective_timeout)},
      {"--peer_startup_timeout", absl::GetFlag(FLAGS_peer_startup_timeout)},
      {"--stream_stall_timeout", absl::GetFlag(FLAGS_stream_stall_timeout)},
  };
  for (const auto& [flag, value] : durations) {
    if (value <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, " is ", absl::FormatDuration(value),
                       ", expected a duration above 0 (e.g. 60s)"));
    }
  }
  if (absl::GetFlag(FLAGS_peer_buffer_bytes) == 0) {
    return absl::InvalidArgumentError(
        "--peer_buffer_bytes is 0, expected room for the messages peers send "
        "ahead of this rank (default 1 GiB)");
  }
  // Checked again where the credentials are made (world size above 1);
  // here too, so that --check_config refuses it on every rank.
  // At most a day: gRPC takes the interval as 32-bit seconds, where a
  // larger value wrapped (to 0 s and up).
  const absl::Duration refresh = absl::GetFlag(FLAGS_peer_tls_refresh);
  if (refresh < absl::Seconds(1) || refresh > absl::Hours(24)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--peer_tls_refresh is ", absl::FormatDuration(refresh),
                     ", expected 1s to 24h (default 60s)"));
  }
  // Sent in the handshake's proto3 string, which refuses to parse what is
  // not UTF-8: every handshake would fail, with a parse error.
  const std::string group = absl::GetFlag(FLAGS_peer_group);
  if (const size_t bad = FirstInvalidUtf8Byte(group); bad < group.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--peer_group is not UTF-8 (byte ", bad, "), expected UTF-8 text"));
  }
  // "/name.": POSIX shared-memory names are "/" and no other "/"; an empty
  // prefix would let clients register any object of an allowed owner.
  const std::string prefix = absl::GetFlag(FLAGS_shm_prefix);
  if (prefix.size() < 2 || prefix[0] != '/' ||
      prefix.find('/', 1) != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--shm_prefix is '", prefix,
        "', expected '/' and a name start without another '/' (default '",
        kDefaultShmPrefix, "')"));
  }
  return absl::OkStatus();
}

// --shm_owner_uids as numbers.
absl::StatusOr<std::vector<uint32_t>> ShmOwnerUids() {
  std::vector<uint32_t> uids;
  for (const std::string& uid : absl::GetFlag(FLAGS_shm_owner_uids)) {
    uint32_t parsed = 0;
    if (!absl::SimpleAtoi(uid, &parsed)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--shm_owner_uids has '", uid, "', expected numeric uids"));
    }
    uids.push_back(parsed);
  }
  return uids;
}

absl::Status Run(const std::set<std::string>& named_flags) {
  const sigset_t signals = BlockShutdownSignals();
  const codecs::CodecRegistry& registry = codecs::BuiltinCodecs();
  GC_RETURN_IF_ERROR(
      CheckNoIndirectFlags(named_flags, absl::GetFlag(FLAGS_config)));
  absl::StatusOr<v1::DaemonConfig> config = LoadConfig(
      absl::GetFlag(FLAGS_config), GivenFlags(named_flags), registry);
  if (!config.ok()) return config.status();
  GC_ASSIGN_OR_RETURN(
      const ClientAuthOptions auth,
      ClientAuthFromFlags(absl::GetFlag(FLAGS_client_token_file),
                          absl::GetFlag(FLAGS_allow_unauthenticated_tcp)));
  GC_RETURN_IF_ERROR(CheckListenAddress(config->listen(), auth));
  GC_ASSIGN_OR_RETURN(const mode_t socket_mode,
                      ParseSocketMode(absl::GetFlag(FLAGS_socket_mode)));
  GC_RETURN_IF_ERROR(CheckFlagValues());
  GC_ASSIGN_OR_RETURN(std::vector<uint32_t> shm_owner_uids, ShmOwnerUids());
  if (absl::GetFlag(FLAGS_check_config)) {
    std::printf("%s\n", ConfigToJson(*config).c_str());
    return absl::OkStatus();
  }

  codecs::StateStore store;
  Metrics metrics(&store, kVersion);
  const int rank = static_cast<int>(config->rank());
  const int world_size = static_cast<int>(config->world_size());
  // Declared first, destroyed last: the transport reads its policy hash
  // for every handshake until it stops.
  std::unique_ptr<Engine> engine;
  PeerMetrics peer_metrics(rank, world_size);
  MailboxOptions mailbox_options;
  mailbox_options.max_unclaimed_bytes = absl::GetFlag(FLAGS_peer_buffer_bytes);
  // A message waits for this rank's call at least as long as its sender
  // waits for this rank: a rank later than the expiry but within a long
  // --collective_timeout would otherwise free it as its own step begins,
  // then wait for it in vain.
  mailbox_options.unclaimed_ttl =
      std::max(mailbox_options.unclaimed_ttl,
               2 * absl::GetFlag(FLAGS_collective_timeout));
  Mailbox mailbox(world_size, mailbox_options, &peer_metrics);
  std::unique_ptr<GrpcTransport> transport;
  std::unique_ptr<Collective> collective;
  if (world_size == 1) {
    collective = std::make_unique<LocalCollective>();
  } else {
    GrpcTransportOptions options;
    options.rank = rank;
    options.peers.assign(config->peers().begin(), config->peers().end());
    options.listen = absl::GetFlag(FLAGS_peer_listen);
    options.max_message_bytes = PeerMessageLimit(config->max_tensor_bytes());
    PeerTlsFiles tls = PeerTlsFilesFromConfig(*config);
    tls.refresh = absl::GetFlag(FLAGS_peer_tls_refresh);
    GC_ASSIGN_OR_RETURN(options.credentials, MakePeerCredentials(tls));
    if (options.credentials.tls) {
      std::fprintf(stderr,
                   "gradcompd: rank %d: peers over mutual TLS (%s, CA %s, "
                   "checked for rotation every %s)\n",
                   rank, tls.cert.c_str(), tls.ca.c_str(),
                   absl::FormatDuration(tls.refresh).c_str());
    }
    PeerIdentity identity;
    identity.version = kVersion;
    identity.wire_version = codecs::kWireVersion;
    identity.world_size = world_size;
    identity.rank = rank;
    identity.seed = config->seed();
    std::random_device random;
    identity.instance = (uint64_t{random()} << 32) | random();
    identity.group = absl::GetFlag(FLAGS_peer_group);
    GC_ASSIGN_OR_RETURN(transport, GrpcTransport::Create(
                                       options,
                                       [identity, &engine] {
                                         PeerIdentity current = identity;
                                         current.policy_hash =
                                             engine->policy_schedule_hash();
                                         return current;
                                       },
                                       &mailbox, &peer_metrics));
    collective = std::make_unique<PeerCollective>(
        transport.get(), &mailbox,
        PeerCollectiveOptions{absl::GetFlag(FLAGS_collective_timeout)},
        &peer_metrics);
  }
  EngineOptions engine_options = EngineOptionsFromConfig(*config);
  // Members of a batch wait for each other as long as ranks do.
  engine_options.batch_timeout = absl::GetFlag(FLAGS_collective_timeout);
  GC_ASSIGN_OR_RETURN(Policy policy, PolicyFromProto(config->policy()));
  GC_ASSIGN_OR_RETURN(
      engine, Engine::Create(engine_options, registry, &store, collective.get(),
                             &metrics, std::move(policy)));
  // The schedule the others hold, before any peer compares it.
  for (const v1::ScheduledPolicy& entry : config->scheduled_policies()) {
    GC_ASSIGN_OR_RETURN(Policy scheduled, PolicyFromProto(entry.policy()));
    GC_RETURN_IF_ERROR(
        engine->SetPolicy(std::move(scheduled), entry.from_step()).status());
  }
  if (transport != nullptr) GC_RETURN_IF_ERROR(transport->Start());
  std::unique_ptr<prometheus::Exposer> exposer;
  std::string metrics_address = "metrics off";
  if (!config->metrics_listen().empty()) {
    GC_ASSIGN_OR_RETURN(exposer, StartMetricsServer(config->metrics_listen(),
                                                    metrics.collectable()));
    if (world_size > 1)
      exposer->RegisterCollectable(peer_metrics.collectable());
    metrics_address = absl::StrCat(
        "metrics on http://",
        BoundAddress(config->metrics_listen(), exposer->GetListeningPorts()[0]),
        "/metrics");
  }

  // A stream's tensors each hold a worker while their collective waits for
  // the other ranks, which may reach them in another order: with peers the
  // pool must hold a whole bucket, or ranks wait on each other until the
  // deadline. Threads start on demand (WorkerPool), so these are caps: a
  // daemon runs as many as its peak of concurrent tensors. A tensor waiting
  // on its peers or its batch does not count against `running`: up to
  // --max_rpc_threads threads, as many as unary calls may hold, so that
  // tensors queued behind waiting ones (members of their batches) still
  // get a thread.
  StreamOptions streams;
  streams.pool.running =
      world_size > 1
          ? 256
          : std::max(2, static_cast<int>(std::thread::hardware_concurrency()));
  streams.pool.threads = std::max(streams.pool.running,
                                  static_cast<int>(config->max_rpc_threads()));
  streams.pool.queued = config->max_queued_requests();
  // A client's unread answers hold the budget until it reads them, or the
  // stall timeout: past a sixteenth of the budget its stream reads no more
  // requests, so that it holds little more than that (the answers of the
  // requests already read still come).
  streams.max_unwritten_bytes =
      std::min(streams.max_unwritten_bytes, config->memory_budget_bytes() / 16);
  streams.stall_timeout = absl::GetFlag(FLAGS_stream_stall_timeout);
  // Off unless asked: a region maps a client's memory into the daemon.
  std::unique_ptr<SharedMemoryRegistry> shm;
  if (config->allow_client_shm()) {
    SharedMemoryOptions shm_options;
    shm_options.key_prefix = absl::GetFlag(FLAGS_shm_prefix);
    shm_options.owner_uids = std::move(shm_owner_uids);
    shm = std::make_unique<SharedMemoryRegistry>(shm_options, &metrics);
  }
  GradcompService service(engine.get(), &metrics, streams, Settings(*config),
                          shm.get());
  AuthenticatedService guarded(&service, ClientAuth(auth));
  GC_RETURN_IF_ERROR(PrepareSocketDirectory(config->listen()));
  int port = 0;
  GC_ASSIGN_OR_RETURN(
      std::unique_ptr<grpc::Server> server,
      StartGrpcServer(config->listen(), &guarded, &port, &metrics,
                      MaxReceiveBytes(config->max_tensor_bytes()),
                      static_cast<int>(config->max_rpc_threads())));
  std::unique_ptr<grpc::Server> health;
  if (const std::string probes = absl::GetFlag(FLAGS_health_listen);
      !probes.empty()) {
    GC_ASSIGN_OR_RETURN(health, StartHealthServer(probes));
  }
  // Both servers' health says the same. gRPC's starts as SERVING: with
  // peers it is turned off before anything else, so that a probe between
  // the start and the wait for peers does not pass.
  auto set_serving = [&server, &health](bool serving) {
    server->GetHealthCheckService()->SetServingStatus(serving);
    if (health != nullptr) {
      health->GetHealthCheckService()->SetServingStatus(serving);
    }
  };
  if (transport != nullptr) set_serving(false);
  GC_RETURN_IF_ERROR(SetSocketMode(config->listen(), socket_mode));
  std::fprintf(stderr,
               "gradcompd %s: serving gRPC on %s, %s; rank %u of "
               "world_size %u, policy %s\n",
               kVersion, BoundAddress(config->listen(), port).c_str(),
               metrics_address.c_str(), config->rank(), config->world_size(),
               engine->policy()->hash.c_str());

  // With peers, health says NOT_SERVING until every peer is connected both
  // ways; a daemon that cannot reach them all in time exits with the
  // reason (a SIGTERM to itself ends the wait below).
  absl::Status peers_status;
  std::thread peers_wait;
  if (transport != nullptr) {
    peers_wait = std::thread([&] {
      peers_status = transport->WaitForPeers(
          absl::Now() + absl::GetFlag(FLAGS_peer_startup_timeout));
      if (peers_status.ok()) {
        std::fprintf(stderr, "gradcompd: rank %d: all %d peers connected\n",
                     rank, world_size - 1);
        peer_metrics.EndStarting();
        set_serving(true);
      } else {
        kill(getpid(), SIGTERM);
      }
    });
  }

  const int signal = WaitForShutdownSignal(signals);
  if (peers_wait.joinable()) {
    transport->StopWaiting();
    peers_wait.join();
  }
  if (!peers_status.ok() && !absl::IsCancelled(peers_status)) {
    server->Shutdown(std::chrono::system_clock::now());
    return peers_status;
  }
  std::fprintf(stderr, "gradcompd: %s received, shutting down\n",
               signal == SIGTERM ? "SIGTERM" : "SIGINT");
  // Health turns NOT_SERVING first so that probes stop routing here, then
  // in-flight calls get a few seconds to finish: those waiting for peers
  // end at once, which would otherwise hold the server's shutdown until
  // their deadline (--collective_timeout, 60 s by default, past a
  // Kubernetes pod's 30 s grace period).
  server->GetHealthCheckService()->Shutdown();
  if (health != nullptr) health->GetHealthCheckService()->Shutdown();
  engine->Shutdown(absl::UnavailableError(
      absl::StrCat("rank ", rank, " is shutting down (",
                   signal == SIGTERM ? "SIGTERM" : "SIGINT",
                   "); its in-flight reduces end")));
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  server->Wait();
  if (health != nullptr) health->Shutdown(std::chrono::system_clock::now());
  return absl::OkStatus();
}

}  // namespace
}  // namespace gradcomp::service

namespace {
// Every reduce allocates request, payload and result buffers of a tensor's
// size (MBs). By default glibc maps blocks over 128 KiB straight from the
// kernel, returns freed heap tops, and unmaps a thread arena's heap once it
// is free, so each step faulted in fresh zeroed pages: ~3 ms/MB on the
// benchmark VM, 3-5x the step's own work (docs/decisions.md). Keep freed
// memory for the next step instead, in the one main heap (which, unlike
// the 64 MiB per-thread heaps, is never unmapped); RSS then stays at the
// high-water mark of a step's working set.
void KeepFreedMemoryForReuse() {
  mallopt(M_ARENA_MAX, 1);
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
}

// Whether this program names an ELF interpreter (it is dynamically linked):
// the first object dl_iterate_phdr reports is the program itself.
bool HasInterpreter() {
  bool found = false;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t /*size*/, void* data) {
        for (ElfW(Half) i = 0; i < info->dlpi_phnum; ++i) {
          if (info->dlpi_phdr[i].p_type == PT_INTERP) {
            *static_cast<bool*>(data) = true;
          }
        }
        return 1;  // the program only
      },
      &found);
  return found;
}

// Started as `ld-linux-x86-64.so.2 [loader options] gradcompd [flags]` (as
// tools/gpu_test's bundle runs it on machines without Debian's libraries),
// the kernel executed the loader, so it reports no interpreter (AT_BASE 0)
// although the program has one: /proc/self/exe is the loader and argv has
// lost the loader's options. The restart must then run the original command
// line again, which /proc/self/cmdline still holds, instead of handing the
// daemon's flags to the loader (which refused them: "unrecognized option").
bool StartedThroughLoader() {
  return getauxval(AT_BASE) == 0 && HasInterpreter();
}

// This process's command line as the kernel got it; empty if unreadable.
std::vector<std::string> OriginalCommandLine() {
  std::FILE* file = std::fopen("/proc/self/cmdline", "rb");
  if (file == nullptr) return {};
  std::string all;
  char buffer[4096];
  for (size_t n; (n = std::fread(buffer, 1, sizeof(buffer), file)) > 0;) {
    all.append(buffer, n);
  }
  std::fclose(file);
  // NUL-terminated arguments, any of which may be empty.
  if (all.empty() || all.back() != '\0') return {};
  all.pop_back();
  return absl::StrSplit(all, '\0');
}

// Executes the binary again with `argv`; returns only if that fails.
void RestartByOwnPath(char** argv) {
  // By the binary's own path: the kernel names a process after the file it
  // executes, and ps, top and pgrep should show gradcompd, not "exe". A
  // binary replaced on disk since it started has lost that path (it reads
  // "... (deleted)"); /proc/self/exe still reaches it.
  char path[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n > 0) {
    path[n] = '\0';
    execv(path, argv);
  }
  execv("/proc/self/exe", argv);
}

// That high-water mark is still faulted in 4 KiB at a time (tens of
// thousands of faults per daemon over the first steps), and every copy and
// checksum through the step's 100 MB of buffers misses the TLB page after
// page (costly under a VM's nested page tables): 2 MiB pages cut the
// daemon's CPU per dense step by 44 % on the benchmark VM (docs/
// benchmarks.md, "CPU per step, round 6"). glibc (>= 2.35) backs its heap with
// transparent huge pages when the tunable glibc.malloc.hugetlb is 1, but
// reads tunables only when a process starts and has no mallopt for this
// one: so the daemon starts itself again with it set, unless whoever
// started it chose a value (glibc.malloc.hugetlb=0 keeps 4 KiB pages). If
// the exec fails, it goes on as it is.
void RestartWithHugePageHeap(char** argv) {
  constexpr char kTunable[] = "glibc.malloc.hugetlb";
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (tunables != nullptr && std::strstr(tunables, kTunable) != nullptr) {
    return;
  }
  std::vector<std::string> loader_command;
  if (StartedThroughLoader()) {
    loader_command = OriginalCommandLine();
    if (loader_command.empty()) {
      std::fprintf(stderr,
                   "gradcompd: started through the dynamic loader and "
                   "/proc/self/cmdline is unreadable; not restarting with "
                   "%s=1, the heap stays on 4 KiB pages\n",
                   kTunable);
      return;
    }
  }
  const std::string value = tunables == nullptr || *tunables == '\0'
                                ? absl::StrCat(kTunable, "=1")
                                : absl::StrCat(tunables, ":", kTunable, "=1");
  if (setenv("GLIBC_TUNABLES", value.c_str(), 1) != 0) return;
  if (loader_command.empty()) {
    RestartByOwnPath(argv);
  } else {
    std::vector<char*> args;
    for (std::string& arg : loader_command) args.push_back(arg.data());
    args.push_back(nullptr);
    execv("/proc/self/exe", args.data());
  }
  std::fprintf(stderr,
               "gradcompd: could not restart with %s=1 (%s); the heap stays "
               "on 4 KiB pages\n",
               kTunable, std::strerror(errno));
}
}  // namespace

int main(int argc, char** argv) {
  RestartWithHugePageHeap(argv);
  KeepFreedMemoryForReuse();
  // Debian's Abseil is built without NDEBUG, so every Mutex lock and
  // destruction would update a process-wide lock-order graph under one
  // global lock; that is a debugging aid (the unit tests keep it), not
  // something a serving daemon pays for. See docs/decisions.md.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  absl::SetProgramUsageMessage(
      "gradcompd: gradient-compression sidecar daemon (see docs/daemon.md)");
  const std::set<std::string> named = gradcomp::service::NamedFlags(argc, argv);
  const std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  absl::Status status = gradcomp::service::CheckNoArguments(positional);
  if (status.ok()) status = gradcomp::service::Run(named);
  if (!status.ok()) {
    std::fprintf(stderr, "gradcompd: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
