// The daemon's effective configuration: built-in defaults, then a config
// file (gradcomp.v1.DaemonConfig as protobuf JSON or text format), then the
// command-line flags that were given, then validation of the whole, policy
// included, so that a bad config fails at start with a message, not at the
// first tensor.
//
//   FlagOverrides flags;
//   flags.listen = "unix:/run/gradcomp/gradcomp.sock";
//   GC_ASSIGN_OR_RETURN(v1::DaemonConfig config,
//                       LoadConfig("gradcomp.json", flags, BuiltinCodecs()));
#ifndef GRADCOMP_SERVICE_CONFIG_CONFIG_H_
#define GRADCOMP_SERVICE_CONFIG_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "codecs/registry.h"
#include "gradcomp/v1/config.pb.h"
#include "service/engine/engine.h"
#include "service/transport/peer_credentials.h"

namespace gradcomp::service {

namespace v1 = ::gradcomp::v1;

// The client API on a unix socket by default: only local processes that
// the socket's mode admits can call it (docs/security.md, Client access).
inline constexpr char kDefaultListen[] = "unix:/run/gradcomp/gradcomp.sock";
inline constexpr char kDefaultMetricsListen[] = "127.0.0.1:9464";

// Flags given on the command line; each set one replaces the config's field.
struct FlagOverrides {
  std::optional<std::string> listen;
  std::optional<std::string> metrics_listen;  // "" turns metrics off
  std::optional<uint32_t> rank;
  std::optional<uint32_t> world_size;
  std::optional<std::vector<std::string>> peers;
  std::optional<uint64_t> seed;
  std::optional<double> error_sample_rate;
  std::optional<bool> allow_client_shm;
  std::optional<std::string> peer_tls_cert;
  std::optional<std::string> peer_tls_key;
  std::optional<std::string> peer_tls_ca;
  // Limits (docs/daemon.md, "Limits").
  std::optional<uint64_t> max_tensor_bytes;
  std::optional<uint64_t> memory_budget_bytes;
  std::optional<double> memory_wait_seconds;
  std::optional<uint64_t> max_concurrent_jobs;
  std::optional<uint64_t> max_tensors_per_job;
  std::optional<uint64_t> max_state_bytes_per_job;
  std::optional<uint64_t> max_queued_requests;
  std::optional<uint64_t> max_rpc_threads;
};

// Every field at its default: the listen addresses above, world size 1,
// error_sample_rate 0.1, max_tensor_bytes 4 GiB, and the limits'
// (DefaultMemoryBudgetBytes() for the memory budget).
v1::DaemonConfig DefaultConfig();

// Parses the file at `path` and merges the fields it sets over `config`.
// ".json" is JSON; ".textproto", ".txtpb", ".pbtxt" and ".txt" are text
// format; any other name is JSON if it starts with '{', text otherwise.
// Errors name the file, the format and the parser's message.
absl::Status MergeConfigFile(const std::string& path, v1::DaemonConfig* config);

// MergeConfigFile on text already read; `path` picks the format as above and
// names the source in errors.
absl::Status MergeConfigText(const std::string& path, const std::string& text,
                             v1::DaemonConfig* config);

void ApplyFlags(const FlagOverrides& flags, v1::DaemonConfig* config);

// Checks addresses, rank, world size, peers (one host:port per rank when
// world_size > 1), limits and the policy (every codec created once through
// `registry`).
absl::Status ValidateConfig(const v1::DaemonConfig& config,
                            const codecs::CodecRegistry& registry);

// Defaults, then the file at `config_path` (if not empty), then `flags`,
// then ValidateConfig. The policy comes back with its defaults written out.
absl::StatusOr<v1::DaemonConfig> LoadConfig(
    const std::string& config_path, const FlagOverrides& flags,
    const codecs::CodecRegistry& registry);

EngineOptions EngineOptionsFromConfig(const v1::DaemonConfig& config);

// The peer TLS files the config names (none: plaintext peers).
PeerTlsFiles PeerTlsFilesFromConfig(const v1::DaemonConfig& config);

// Pretty-printed JSON with every field, for --check_config.
std::string ConfigToJson(const v1::DaemonConfig& config);

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_CONFIG_CONFIG_H_
