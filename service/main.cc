// gradcompd: the gradient-compression sidecar daemon. Flags and wiring only;
// everything it runs lives in service/{config,engine,api,metrics}.
//
//   gradcompd --listen=127.0.0.1:50051 --metrics_listen=127.0.0.1:9464 \
//             --config=/etc/gradcomp/daemon.json
//   gradcompd --config=daemon.json --check_config   # validate, print, exit
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "base/status_macros.h"
#include "codecs/builtin.h"
#include "codecs/state.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "service/api/gradcomp_service.h"
#include "service/api/server.h"
#include "service/collective/local_collective.h"
#include "service/config/config.h"
#include "service/config/policy_proto.h"
#include "service/engine/engine.h"
#include "service/metrics/metrics.h"
#include "service/metrics/metrics_server.h"
#include "service/version.h"

ABSL_FLAG(std::string, listen, gradcomp::service::kDefaultListen,
          "Client API address: host:port, or unix:/path/to.sock.");
ABSL_FLAG(std::string, metrics_listen, gradcomp::service::kDefaultMetricsListen,
          "Prometheus /metrics address (host:port); empty turns metrics off.");
ABSL_FLAG(std::string, config, "",
          "DaemonConfig file (gradcomp/v1/config.proto), protobuf JSON or text "
          "format; flags given on the command line override its fields.");
ABSL_FLAG(uint32_t, rank, 0, "This worker's rank in [0, world_size).");
ABSL_FLAG(uint32_t, world_size, 1,
          "Workers per job. Only 1 until the peer transport exists.");
ABSL_FLAG(std::vector<std::string>, peers, {},
          "Comma-separated host:port of every rank's daemon, by rank.");
ABSL_FLAG(uint64_t, seed, 0,
          "Job seed of the codecs' random streams; the same on every rank.");
ABSL_FLAG(bool, check_config, false,
          "Validate the config and policy, print the effective config as "
          "JSON, and exit 0 (valid) or 1 (invalid) without serving.");

namespace gradcomp::service {
namespace {

// The flag names written on the command line ("--name", "--name=value",
// "-name"); this absl version keeps IsSpecifiedOnCommandLine private, and a
// flag given with its default value must still override the config file.
std::set<std::string> NamedFlags(int argc, char** argv) {
  std::set<std::string> names;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (!absl::ConsumePrefix(&arg, "-")) continue;
    absl::ConsumePrefix(&arg, "-");
    names.emplace(arg.substr(0, arg.find('=')));
  }
  return names;
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
  return flags;
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

absl::Status Run(const std::set<std::string>& named_flags) {
  const sigset_t signals = BlockShutdownSignals();
  const codecs::CodecRegistry& registry = codecs::BuiltinCodecs();
  absl::StatusOr<v1::DaemonConfig> config = LoadConfig(
      absl::GetFlag(FLAGS_config), GivenFlags(named_flags), registry);
  if (absl::GetFlag(FLAGS_check_config)) {
    if (!config.ok()) return config.status();
    std::printf("%s\n", ConfigToJson(*config).c_str());
    return absl::OkStatus();
  }
  if (!config.ok()) return config.status();

  codecs::StateStore store;
  Metrics metrics(&store, kVersion);
  LocalCollective collective;
  GC_ASSIGN_OR_RETURN(
      std::unique_ptr<Engine> engine,
      Engine::Create(EngineOptionsFromConfig(*config), registry, &store,
                     &collective, &metrics, PolicyFromProto(config->policy())));

  std::unique_ptr<prometheus::Exposer> exposer;
  std::string metrics_address = "metrics off";
  if (!config->metrics_listen().empty()) {
    GC_ASSIGN_OR_RETURN(exposer, StartMetricsServer(config->metrics_listen(),
                                                    metrics.collectable()));
    metrics_address = absl::StrCat(
        "metrics on http://",
        BoundAddress(config->metrics_listen(), exposer->GetListeningPorts()[0]),
        "/metrics");
  }

  const int workers =
      std::max(2, static_cast<int>(std::thread::hardware_concurrency()));
  GradcompService service(engine.get(), &metrics, workers);
  int port = 0;
  GC_ASSIGN_OR_RETURN(std::unique_ptr<grpc::Server> server,
                      StartGrpcServer(config->listen(), &service, &port));
  std::fprintf(stderr,
               "gradcompd %s: serving gRPC on %s, %s; rank %u of "
               "world_size %u, policy %s\n",
               kVersion, BoundAddress(config->listen(), port).c_str(),
               metrics_address.c_str(), config->rank(), config->world_size(),
               engine->policy()->hash.c_str());

  const int signal = WaitForShutdownSignal(signals);
  std::fprintf(stderr, "gradcompd: %s received, shutting down\n",
               signal == SIGTERM ? "SIGTERM" : "SIGINT");
  // Health turns NOT_SERVING first so that probes stop routing here, then
  // in-flight calls get a few seconds to finish.
  server->GetHealthCheckService()->Shutdown();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  server->Wait();
  return absl::OkStatus();
}

}  // namespace
}  // namespace gradcomp::service

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "gradcompd: gradient-compression sidecar daemon (see docs/daemon.md)");
  const std::set<std::string> named = gradcomp::service::NamedFlags(argc, argv);
  absl::ParseCommandLine(argc, argv);
  const absl::Status status = gradcomp::service::Run(named);
  if (!status.ok()) {
    std::fprintf(stderr, "gradcompd: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
