#include "service/config/config.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "base/file_bytes.h"
#include "base/status_macros.h"
#include "base/unix_socket_path.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/message.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"
#include "service/config/policy_proto.h"
#include "service/config/utf8.h"
#include "service/engine/memory_budget.h"
#include "service/engine/policy_schedule.h"

namespace gradcomp::service {
namespace {

constexpr uint64_t kDefaultMaxTensorBytes = uint64_t{4} << 30;
// A tenth of the reduces (the first one always): a ResNet-50 step of 161
// tensors still feeds the error histogram 16 samples, at a tenth of the
// extra decode's CPU (docs/decisions.md).
constexpr double kDefaultErrorSampleRate = 0.1;
// ReduceStream tensors waiting for a worker (GradcompService's default).
constexpr uint64_t kDefaultMaxQueuedRequests = 4096;
constexpr uint64_t kDefaultMaxRpcThreads = 1024;

// Collects the text-format parser's complaints instead of printing them.
class TextErrors : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    errors_.push_back(
        absl::StrCat("line ", line + 1, " column ", column + 1, ": ", message));
  }
  void AddWarning(int line, int column, const std::string& message) override {
    AddError(line, column, message);
  }
  std::string str() const { return absl::StrJoin(errors_, "; "); }

 private:
  std::vector<std::string> errors_;
};

// Proto3 JSON leaves a field that holds its zero value ("world_size": 0,
// "listen": "") unset, and MergeFrom then keeps the default under it: the
// file's value would be lost without a word. So every field the file names
// (but as null, which means the default) is cleared in `message` before
// the merge, message fields field by field: the file's zero then stands,
// and ValidateConfig judges it. A repeated field the file names replaces
// the default's instead of adding to it.
void ClearFieldsNamed(const google::protobuf::Struct& named,
                      google::protobuf::Message* message) {
  const google::protobuf::Descriptor* type = message->GetDescriptor();
  const google::protobuf::Reflection* reflection = message->GetReflection();
  for (const auto& [key, value] : named.fields()) {
    if (value.kind_case() == google::protobuf::Value::kNullValue) continue;
    const google::protobuf::FieldDescriptor* field = type->FindFieldByName(key);
    for (int i = 0; field == nullptr && i < type->field_count(); ++i) {
      if (type->field(i)->json_name() == key) field = type->field(i);
    }
    if (field == nullptr) continue;  // the parse has refused it already
    if (field->cpp_type() ==
            google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE &&
        !field->is_repeated()) {
      if (value.kind_case() == google::protobuf::Value::kStructValue) {
        ClearFieldsNamed(value.struct_value(),
                         reflection->MutableMessage(message, field));
      }
    } else {
      reflection->ClearField(message, field);
    }
  }
}

absl::Status MergeJson(const std::string& path, const std::string& text,
                       v1::DaemonConfig* config) {
  v1::DaemonConfig file;
  google::protobuf::util::Status parsed =
      google::protobuf::util::JsonStringToMessage(text, &file);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config file '", path, "': not a JSON gradcomp.v1.DaemonConfig: ",
        parsed.message().ToString()));
  }
  // The same text as a plain JSON object, for the names it holds.
  google::protobuf::Struct named;
  if (google::protobuf::util::JsonStringToMessage(text, &named).ok()) {
    ClearFieldsNamed(named, config);
  }
  config->MergeFrom(file);
  return absl::OkStatus();
}

absl::Status MergeText(const std::string& path, const std::string& text,
                       v1::DaemonConfig* config) {
  // Merging in place keeps presence: an explicit metrics_listen: "" sets it.
  TextErrors errors;
  google::protobuf::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  v1::DaemonConfig merged = *config;
  if (!parser.MergeFromString(text, &merged)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config file '", path,
        "': not a text-format gradcomp.v1.DaemonConfig: ", errors.str()));
  }
  *config = std::move(merged);
  return absl::OkStatus();
}

bool LooksLikeJson(const std::string& path, const std::string& text) {
  if (absl::EndsWith(path, ".json")) return true;
  for (absl::string_view ext : {".textproto", ".txtpb", ".pbtxt", ".txt"}) {
    if (absl::EndsWith(path, ext)) return false;
  }
  return absl::StartsWith(absl::StripLeadingAsciiWhitespace(text), "{");
}

// `address` is unix:/path or host:port with a decimal port up to 65535,
// and above 0 unless `any_port` (0: the kernel picks one, for listening).
absl::Status ValidateAddress(absl::string_view what, const std::string& address,
                             bool any_port) {
  if (const std::optional<absl::string_view> path = UnixSocketPath(address)) {
    const size_t path_bytes = path->size();
    if (path_bytes == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " is 'unix:' with no path, expected unix:/path/to.sock"));
    }
    if (path_bytes > kMaxUnixSocketPathBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " is '", address, "': the socket path has ", path_bytes,
          " bytes, expected at most ", kMaxUnixSocketPathBytes,
          " (the size of sockaddr_un.sun_path)"));
    }
    return absl::OkStatus();
  }
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is '", address,
                     "', expected host:port (e.g. 127.0.0.1:50051, "
                     "[::1]:50051) or unix:/path"));
  }
  const absl::string_view digits = absl::string_view(address).substr(colon + 1);
  uint32_t port = 0;
  if (!std::all_of(digits.begin(), digits.end(),
                   [](char c) { return absl::ascii_isdigit(c); }) ||
      !absl::SimpleAtoi(digits, &port) || port > 65535 ||
      (port == 0 && !any_port)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " is '", address, "': port '", digits, "' is not a number in ",
        any_port ? "0-65535 (0: any free port)" : "1-65535"));
  }
  return absl::OkStatus();
}

absl::Status ValidateLimits(const v1::DaemonConfig& config) {
  const std::pair<const char*, uint64_t> positive[] = {
      {"memory_budget_bytes", config.memory_budget_bytes()},
      {"max_concurrent_jobs", config.max_concurrent_jobs()},
      {"max_tensors_per_job", config.max_tensors_per_job()},
      {"max_queued_requests", config.max_queued_requests()},
  };
  if (config.max_rpc_threads() < 2 || config.max_rpc_threads() > INT_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_rpc_threads is ", config.max_rpc_threads(),
        ", expected at least 2 (one thread waits for calls, the others serve "
        "them) and at most ",
        INT_MAX));
  }
  for (const auto& [name, value] : positive) {
    if (value == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " is 0, expected a positive number"));
    }
  }
  const double wait = config.memory_wait_seconds();
  if (!(wait >= 0 && wait <= 24 * 3600)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "memory_wait_seconds is ", wait, ", expected seconds in [0, 86400]"));
  }
  return absl::OkStatus();
}

// scheduled_policies: steps that grow, valid policies, within the cap.
absl::Status ValidateScheduledPolicies(const v1::DaemonConfig& config,
                                       const codecs::CodecRegistry& registry) {
  if (static_cast<size_t>(config.scheduled_policies_size()) + 1 >
      PolicySchedule::kMaxEntries) {
    return absl::InvalidArgumentError(absl::StrCat(
        "scheduled_policies holds ", config.scheduled_policies_size(),
        " entries, expected at most ", PolicySchedule::kMaxEntries - 1,
        " (with `policy`, the most a daemon keeps)"));
  }
  int64_t previous = -1;
  for (int i = 0; i < config.scheduled_policies_size(); ++i) {
    const v1::ScheduledPolicy& entry = config.scheduled_policies(i);
    if (entry.from_step() <= previous) {
      return absl::InvalidArgumentError(absl::StrCat(
          "scheduled_policies[", i, "].from_step is ", entry.from_step(),
          ", expected a step >= 0 and above the entry before's (", previous,
          ")"));
    }
    previous = entry.from_step();
    absl::StatusOr<Policy> policy = PolicyFromProto(entry.policy());
    absl::Status valid =
        policy.ok() ? ValidatePolicy(*policy, registry) : policy.status();
    if (!valid.ok()) {
      return absl::Status(valid.code(), absl::StrCat("scheduled_policies[", i,
                                                     "]: ", valid.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

v1::DaemonConfig DefaultConfig() {
  v1::DaemonConfig config;
  config.set_listen(kDefaultListen);
  config.set_metrics_listen(kDefaultMetricsListen);
  config.set_world_size(1);
  config.set_error_sample_rate(kDefaultErrorSampleRate);
  config.set_max_tensor_bytes(kDefaultMaxTensorBytes);
  const EngineOptions engine;
  config.set_memory_budget_bytes(DefaultMemoryBudgetBytes());
  config.set_memory_wait_seconds(absl::ToDoubleSeconds(engine.memory_wait));
  config.set_max_concurrent_jobs(engine.quotas.max_concurrent_jobs);
  config.set_max_tensors_per_job(engine.quotas.max_tensors_per_job);
  config.set_max_state_bytes_per_job(engine.quotas.max_state_bytes_per_job);
  config.set_max_queued_requests(kDefaultMaxQueuedRequests);
  config.set_max_rpc_threads(kDefaultMaxRpcThreads);
  return config;
}

absl::Status MergeConfigFile(const std::string& path,
                             v1::DaemonConfig* config) {
  // Not an ifstream: a directory opens and reads as "", an empty config
  // that the daemon then ran on (its defaults) without a word.
  absl::StatusOr<std::string> text = ReadFileBytes(path);
  if (!text.ok()) {
    return absl::Status(
        text.status().code(),
        absl::StrCat("config file: ", text.status().message(),
                     "; expected a readable JSON or text-format "
                     "gradcomp.v1.DaemonConfig"));
  }
  return MergeConfigText(path, *text, config);
}

absl::Status MergeConfigText(const std::string& path, const std::string& text,
                             v1::DaemonConfig* config) {
  return LooksLikeJson(path, text) ? MergeJson(path, text, config)
                                   : MergeText(path, text, config);
}

void ApplyFlags(const FlagOverrides& flags, v1::DaemonConfig* config) {
  if (flags.listen) config->set_listen(*flags.listen);
  if (flags.metrics_listen) config->set_metrics_listen(*flags.metrics_listen);
  if (flags.rank) config->set_rank(*flags.rank);
  if (flags.world_size) config->set_world_size(*flags.world_size);
  if (flags.peers) {
    config->clear_peers();
    for (const std::string& peer : *flags.peers) config->add_peers(peer);
  }
  if (flags.seed) config->set_seed(*flags.seed);
  if (flags.error_sample_rate) {
    config->set_error_sample_rate(*flags.error_sample_rate);
  }
  if (flags.allow_client_shm) {
    config->set_allow_client_shm(*flags.allow_client_shm);
  }
  if (flags.max_tensor_bytes) {
    config->set_max_tensor_bytes(*flags.max_tensor_bytes);
  }
  // 0 is the flag's own default, which --helpfull shows: it leaves the
  // budget to the file or to DefaultMemoryBudgetBytes, as the help says,
  // rather than refusing the value shown as the default.
  if (flags.memory_budget_bytes.value_or(0) != 0) {
    config->set_memory_budget_bytes(*flags.memory_budget_bytes);
  }
  if (flags.memory_wait_seconds) {
    config->set_memory_wait_seconds(*flags.memory_wait_seconds);
  }
  if (flags.max_concurrent_jobs) {
    config->set_max_concurrent_jobs(*flags.max_concurrent_jobs);
  }
  if (flags.max_tensors_per_job) {
    config->set_max_tensors_per_job(*flags.max_tensors_per_job);
  }
  if (flags.max_state_bytes_per_job) {
    config->set_max_state_bytes_per_job(*flags.max_state_bytes_per_job);
  }
  if (flags.max_queued_requests) {
    config->set_max_queued_requests(*flags.max_queued_requests);
  }
  if (flags.max_rpc_threads) {
    config->set_max_rpc_threads(*flags.max_rpc_threads);
  }
  if (flags.peer_tls_cert) {
    config->mutable_peer_tls()->set_cert_file(*flags.peer_tls_cert);
  }
  if (flags.peer_tls_key) {
    config->mutable_peer_tls()->set_key_file(*flags.peer_tls_key);
  }
  if (flags.peer_tls_ca) {
    config->mutable_peer_tls()->set_ca_file(*flags.peer_tls_ca);
  }
}

absl::Status ValidateConfig(const v1::DaemonConfig& config,
                            const codecs::CodecRegistry& registry) {
  GC_RETURN_IF_ERROR(CheckStringsAreUtf8(config));
  GC_RETURN_IF_ERROR(
      ValidateAddress("listen", config.listen(), /*any_port=*/true));
  if (!config.metrics_listen().empty()) {
    GC_RETURN_IF_ERROR(ValidateAddress("metrics_listen",
                                       config.metrics_listen(),
                                       /*any_port=*/true));
    if (absl::StartsWith(config.metrics_listen(), "unix:")) {
      return absl::InvalidArgumentError(
          absl::StrCat("metrics_listen is '", config.metrics_listen(),
                       "', expected host:port (Prometheus scrapes over TCP)"));
    }
  }
  if (config.world_size() == 0) {
    return absl::InvalidArgumentError(
        "world_size is 0, expected the number of workers (>= 1)");
  }
  if (config.rank() >= config.world_size()) {
    return absl::InvalidArgumentError(absl::StrCat("rank is ", config.rank(),
                                                   ", expected < world_size ",
                                                   config.world_size()));
  }
  if (config.peers_size() != 0 &&
      config.peers_size() != static_cast<int>(config.world_size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("peers lists ", config.peers_size(),
                     " addresses, expected one per "
                     "rank (world_size ",
                     config.world_size(), ")"));
  }
  if (config.world_size() > 1 && config.peers_size() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "world_size is ", config.world_size(),
        " but peers is empty; expected the host:port of every rank's peer "
        "endpoint, by rank (--peers=h0:50052,h1:50052,...)"));
  }
  for (int i = 0; i < config.peers_size(); ++i) {
    GC_RETURN_IF_ERROR(ValidateAddress(absl::StrCat("peers[", i, "]"),
                                       config.peers(i),
                                       /*any_port=*/false));
    if (absl::StartsWith(config.peers(i), "unix:")) {
      return absl::InvalidArgumentError(
          absl::StrCat("peers[", i, "] is '", config.peers(i),
                       "', expected host:port (peers are other hosts)"));
    }
    for (int j = 0; j < i; ++j) {
      if (config.peers(j) == config.peers(i)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "peers[", j, "] and peers[", i, "] are both '", config.peers(i),
            "', expected each rank's own peer address"));
      }
    }
    // One host:port for two servers: the second bind fails with a bare
    // "address in use", or, where the entry is another rank's, this daemon
    // takes that rank's port and the other rank is the one that cannot
    // start. Said here, it names the cause.
    for (const auto& [name, address] :
         {std::pair<const char*, const std::string&>{"listen", config.listen()},
          {"metrics_listen", config.metrics_listen()}}) {
      if (address == config.peers(i)) {
        return absl::InvalidArgumentError(absl::StrCat(
            name, " is '", address, "', the same as peers[", i,
            "]; expected the client and metrics endpoints apart from every "
            "rank's peer endpoint"));
      }
    }
  }
  const double rate = config.error_sample_rate();
  if (!(rate >= 0 && rate <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "error_sample_rate is ", rate, ", expected a fraction in [0, 1]"));
  }
  if (config.max_tensor_bytes() == 0) {
    return absl::InvalidArgumentError(
        "max_tensor_bytes is 0, expected a positive byte count");
  }
  GC_RETURN_IF_ERROR(ValidateLimits(config));
  GC_RETURN_IF_ERROR(CheckPeerTlsFiles(PeerTlsFilesFromConfig(config)));
  GC_ASSIGN_OR_RETURN(const Policy policy, PolicyFromProto(config.policy()));
  GC_RETURN_IF_ERROR(ValidatePolicy(policy, registry));
  return ValidateScheduledPolicies(config, registry);
}

absl::StatusOr<v1::DaemonConfig> LoadConfig(
    const std::string& config_path, const FlagOverrides& flags,
    const codecs::CodecRegistry& registry) {
  v1::DaemonConfig config = DefaultConfig();
  if (!config_path.empty()) {
    GC_RETURN_IF_ERROR(MergeConfigFile(config_path, &config));
  }
  ApplyFlags(flags, &config);
  GC_RETURN_IF_ERROR(ValidateConfig(config, registry));
  GC_ASSIGN_OR_RETURN(const Policy policy, PolicyFromProto(config.policy()));
  *config.mutable_policy() = PolicyToProto(policy);
  for (v1::ScheduledPolicy& entry : *config.mutable_scheduled_policies()) {
    GC_ASSIGN_OR_RETURN(const Policy scheduled,
                        PolicyFromProto(entry.policy()));
    *entry.mutable_policy() = PolicyToProto(scheduled);
  }
  return config;
}

EngineOptions EngineOptionsFromConfig(const v1::DaemonConfig& config) {
  EngineOptions options;
  options.seed = config.seed();
  options.error_sample_rate = config.error_sample_rate();
  options.max_tensor_bytes = config.max_tensor_bytes();
  options.memory_budget_bytes = config.memory_budget_bytes();
  options.memory_wait = absl::Seconds(config.memory_wait_seconds());
  options.quotas.max_concurrent_jobs = config.max_concurrent_jobs();
  options.quotas.max_tensors_per_job = config.max_tensors_per_job();
  options.quotas.max_state_bytes_per_job = config.max_state_bytes_per_job();
  return options;
}

PeerTlsFiles PeerTlsFilesFromConfig(const v1::DaemonConfig& config) {
  PeerTlsFiles files;
  files.cert = config.peer_tls().cert_file();
  files.key = config.peer_tls().key_file();
  files.ca = config.peer_tls().ca_file();
  return files;
}

std::string ConfigToJson(const v1::DaemonConfig& config) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string json;
  // Printing a message of a known type cannot fail.
  (void)google::protobuf::util::MessageToJsonString(config, &json, options);
  return json;
}

}  // namespace gradcomp::service
