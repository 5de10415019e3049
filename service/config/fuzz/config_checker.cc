#include "service/config/fuzz/config_checker.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "codecs/builtin.h"
#include "google/protobuf/util/message_differencer.h"
#include "service/config/config.h"
#include "service/config/policy_proto.h"

namespace gradcomp::service {
namespace {

// One name per format rule of MergeConfigFile.
constexpr const char* kNames[] = {"fuzz.json", "fuzz.txtpb", "fuzz.conf"};

[[noreturn]] void Fail(const std::string& why, const std::string& text) {
  std::fprintf(stderr, "config_fuzzer: %s\ninput text: %s\n", why.c_str(),
               text.c_str());
  std::abort();
}

}  // namespace

absl::Status CheckConfigBytes(const uint8_t* data, size_t size) {
  if (size == 0) return absl::InvalidArgumentError("empty input");
  const std::string name = kNames[data[0] % 3];
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  const codecs::CodecRegistry& registry = codecs::BuiltinCodecs();

  v1::DaemonConfig config = DefaultConfig();
  const absl::Status parsed = MergeConfigText(name, text, &config);
  if (!parsed.ok()) {
    if (!absl::IsInvalidArgument(parsed)) {
      Fail("a parse error is not InvalidArgument: " + parsed.ToString(), text);
    }
    return parsed;
  }
  const absl::Status valid = ValidateConfig(config, registry);
  if (!valid.ok()) {
    if (!absl::IsInvalidArgument(valid) || valid.message().empty()) {
      Fail("an invalid config is not InvalidArgument with a message: " +
               valid.ToString(),
           text);
    }
    return valid;
  }
  // What LoadConfig hands the daemon, and what --check_config prints.
  const absl::StatusOr<Policy> policy = PolicyFromProto(config.policy());
  if (!policy.ok()) {
    Fail(
        "a config ValidateConfig accepts has a policy PolicyFromProto "
        "refuses: " +
            policy.status().ToString(),
        text);
  }
  *config.mutable_policy() = PolicyToProto(*policy);
  const std::string json = ConfigToJson(config);
  v1::DaemonConfig again = DefaultConfig();
  const absl::Status reparsed = MergeConfigText("printed.json", json, &again);
  if (!reparsed.ok()) {
    Fail("the printed config does not parse: " + reparsed.ToString() +
             "\nprinted: " + json,
         text);
  }
  google::protobuf::util::MessageDifferencer differencer;
  std::string differences;
  differencer.ReportDifferencesToString(&differences);
  if (!differencer.Compare(config, again)) {
    Fail("the printed config parses to another config: " + differences +
             "\nprinted: " + json,
         text);
  }
  const absl::Status revalid = ValidateConfig(again, registry);
  if (!revalid.ok()) {
    Fail("the printed config does not validate: " + revalid.ToString(), text);
  }
  EngineOptionsFromConfig(again);
  return absl::OkStatus();
}

}  // namespace gradcomp::service
