#include "service/config/config.h"

#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "codecs/builtin.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/engine/memory_budget.h"

namespace gradcomp::service {
namespace {

using ::testing::HasSubstr;

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(ConfigTest, DefaultsWithoutAFile) {
  auto config = LoadConfig("", FlagOverrides(), codecs::BuiltinCodecs());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->listen(), "unix:/run/gradcomp/gradcomp.sock");
  EXPECT_EQ(config->metrics_listen(), "127.0.0.1:9464");
  EXPECT_EQ(config->world_size(), 1u);
  EXPECT_EQ(config->error_sample_rate(), 0.1);
  EXPECT_EQ(config->max_tensor_bytes(), uint64_t{4} << 30);
  // The policy's defaults are written out, so --check_config shows them.
  EXPECT_EQ(config->policy().dense_below_numel(), 1024u);
  EXPECT_TRUE(config->policy().dense_1d());
  EXPECT_EQ(config->policy().default_codec().name(), "none");
}

TEST(ConfigTest, JsonFileSetsFieldsAndKeepsOtherDefaults) {
  const std::string path = WriteFile("daemon.json", R"({
    "listen": "unix:/tmp/gradcomp.sock",
    "seed": "42",
    "errorSampleRate": 0.5,
    "policy": {
      "warmupSteps": "10",
      "rules": [{"nameGlob": "*.weight", "codec": {"name": "fp16"}}]
    }
  })");
  auto config = LoadConfig(path, FlagOverrides(), codecs::BuiltinCodecs());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->listen(), "unix:/tmp/gradcomp.sock");
  EXPECT_EQ(config->metrics_listen(), "127.0.0.1:9464");
  EXPECT_EQ(config->seed(), 42u);
  EXPECT_EQ(config->error_sample_rate(), 0.5);
  EXPECT_EQ(config->policy().warmup_steps(), 10u);
  ASSERT_EQ(config->policy().rules_size(), 1);
  EXPECT_EQ(config->policy().rules(0).codec().name(), "fp16");
}

TEST(ConfigTest, TextFormatFile) {
  const std::string path = WriteFile("daemon.textproto", R"(
    listen: "0.0.0.0:6000"
    max_tensor_bytes: 1048576
    policy { dense_1d: false default_codec { name: "bf16" } }
  )");
  auto config = LoadConfig(path, FlagOverrides(), codecs::BuiltinCodecs());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->listen(), "0.0.0.0:6000");
  EXPECT_EQ(config->max_tensor_bytes(), 1048576u);
  EXPECT_FALSE(config->policy().dense_1d());
  EXPECT_EQ(config->policy().default_codec().name(), "bf16");
}

TEST(ConfigTest, UnknownExtensionIsSniffed) {
  auto json = LoadConfig(WriteFile("a.conf", R"({"seed": "7"})"),
                         FlagOverrides(), codecs::BuiltinCodecs());
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ(json->seed(), 7u);
  auto text = LoadConfig(WriteFile("b.conf", "seed: 8"), FlagOverrides(),
                         codecs::BuiltinCodecs());
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(text->seed(), 8u);
}

TEST(ConfigTest, ExplicitEmptyMetricsListenTurnsMetricsOff) {
  auto json = LoadConfig(WriteFile("off.json", R"({"metricsListen": ""})"),
                         FlagOverrides(), codecs::BuiltinCodecs());
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ(json->metrics_listen(), "");
  auto text = LoadConfig(WriteFile("off.txt", R"(metrics_listen: "")"),
                         FlagOverrides(), codecs::BuiltinCodecs());
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(text->metrics_listen(), "");
}

// A JSON file's zero is its value, not "the default" (proto3 JSON leaves
// zeros unset): refused where 0 is not allowed, kept where it is; null is
// the default.
TEST(ConfigTest, JsonZerosAreTheFilesValues) {
  const std::pair<const char*, const char*> refused[] = {
      {R"({"worldSize": 0})", "world_size is 0"},
      {R"({"world_size": 0})", "world_size is 0"},
      {R"({"listen": ""})", "listen is '', expected host:port"},
      {R"({"maxConcurrentJobs": "0"})", "max_concurrent_jobs is 0"},
  };
  for (const auto& [json, message] : refused) {
    auto config = LoadConfig(WriteFile("zero.json", json), FlagOverrides(),
                             codecs::BuiltinCodecs());
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument)
        << json;
    EXPECT_THAT(config.status().message(), HasSubstr(message)) << json;
  }
  auto kept =
      LoadConfig(WriteFile("kept.json",
                           R"({"errorSampleRate": 0, "maxStateBytesPerJob": "0",
                    "metricsListen": null, "policy": {"dense1d": false}})"),
                 FlagOverrides(), codecs::BuiltinCodecs());
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(kept->error_sample_rate(), 0);
  EXPECT_EQ(kept->metrics_listen(), "127.0.0.1:9464");
  EXPECT_EQ(kept->listen(), DefaultConfig().listen());
}

TEST(ConfigTest, FlagsOverrideTheFile) {
  const std::string path =
      WriteFile("flags.json", R"({"listen": "127.0.0.1:1", "seed": "1"})");
  FlagOverrides flags;
  flags.listen = "127.0.0.1:2";
  flags.metrics_listen = "";
  auto config = LoadConfig(path, flags, codecs::BuiltinCodecs());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->listen(), "127.0.0.1:2");
  EXPECT_EQ(config->metrics_listen(), "");
  EXPECT_EQ(config->seed(), 1u);
}

TEST(ConfigTest, ClientSharedMemoryIsOffUnlessAsked) {
  auto defaults = LoadConfig("", FlagOverrides(), codecs::BuiltinCodecs());
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  EXPECT_FALSE(defaults->allow_client_shm());
  const std::string path =
      WriteFile("shm.json", R"({"allow_client_shm": true})");
  auto file = LoadConfig(path, FlagOverrides(), codecs::BuiltinCodecs());
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE(file->allow_client_shm());
  FlagOverrides flags;
  flags.allow_client_shm = false;
  auto overridden = LoadConfig(path, flags, codecs::BuiltinCodecs());
  ASSERT_TRUE(overridden.ok()) << overridden.status();
  EXPECT_FALSE(overridden->allow_client_shm());
}

TEST(ConfigTest, PeerTlsNeedsAllThreeReadableFiles) {
  const std::string cert =
      WriteFile("peer.crt",
                "-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n");
  const std::string key =
      WriteFile("peer.key",
                "-----BEGIN PRIVATE KEY-----\nx\n-----END PRIVATE KEY-----\n");
  const std::string path = WriteFile(
      "tls.json", absl::StrCat(R"({"peer_tls": {"cert_file": ")", cert,
                               R"(", "key_file": ")", key, R"("}})"));
  auto missing = LoadConfig(path, FlagOverrides(), codecs::BuiltinCodecs());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(missing.status().message(),
              HasSubstr("--peer_tls_ca (peer_tls.ca_file) is not"));

  FlagOverrides flags;
  flags.peer_tls_ca = cert;
  auto config = LoadConfig(path, flags, codecs::BuiltinCodecs());
  ASSERT_TRUE(config.ok()) << config.status();
  const PeerTlsFiles files = PeerTlsFilesFromConfig(*config);
  EXPECT_EQ(files.cert, cert);
  EXPECT_EQ(files.key, key);
  EXPECT_EQ(files.ca, cert);

  flags.peer_tls_key = std::string(std::getenv("TEST_TMPDIR")) + "/absent.key";
  EXPECT_THAT(
      LoadConfig(path, flags, codecs::BuiltinCodecs()).status().message(),
      HasSubstr("absent.key', which cannot be read"));
  EXPECT_FALSE(PeerTlsFilesFromConfig(
                   *LoadConfig("", FlagOverrides(), codecs::BuiltinCodecs()))
                   .enabled());
}

TEST(ConfigTest, ErrorSampleRateFlagOverridesTheFileAndIsValidated) {
  const std::string path =
      WriteFile("rate.json", R"({"error_sample_rate": 0.5})");
  FlagOverrides flags;
  flags.error_sample_rate = 0.01;
  auto config = LoadConfig(path, flags, codecs::BuiltinCodecs());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->error_sample_rate(), 0.01);
  EXPECT_EQ(EngineOptionsFromConfig(*config).error_sample_rate, 0.01);
  flags.error_sample_rate = 2;
  EXPECT_EQ(LoadConfig(path, flags, codecs::BuiltinCodecs()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ConfigTest, BadFilesNameTheFileAndTheProblem) {
  auto missing = LoadConfig("/nonexistent/gradcomp.json", FlagOverrides(),
                            codecs::BuiltinCodecs());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(
      missing.status().message(),
      HasSubstr("config file: cannot open '/nonexistent/gradcomp.json'"));
  // A directory opened as a stream read as an empty config: the daemon ran
  // on its defaults.
  auto directory = LoadConfig(::testing::TempDir(), FlagOverrides(),
                              codecs::BuiltinCodecs());
  EXPECT_EQ(directory.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(directory.status().message(),
              HasSubstr("is a directory, expected a file"));

  const std::string bad_json = WriteFile("bad.json", R"({"listen": )");
  auto json = LoadConfig(bad_json, FlagOverrides(), codecs::BuiltinCodecs());
  EXPECT_EQ(json.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(json.status().message(), HasSubstr(bad_json));
  EXPECT_THAT(json.status().message(), HasSubstr("not a JSON"));

  const std::string typo = WriteFile("typo.json", R"({"lisen": "x:1"})");
  auto unknown = LoadConfig(typo, FlagOverrides(), codecs::BuiltinCodecs());
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.status().message(), HasSubstr("lisen"));

  const std::string bad_text =
      WriteFile("bad.textproto", "listen: \"a:1\"\nwrold_size: 2\n");
  auto text = LoadConfig(bad_text, FlagOverrides(), codecs::BuiltinCodecs());
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(text.status().message(), HasSubstr("line 2"));
  EXPECT_THAT(text.status().message(), HasSubstr("wrold_size"));
}

TEST(ConfigTest, BadPolicyFailsAtLoad) {
  const std::string path = WriteFile("policy.json", R"({"policy": {"rules": [
      {"nameGlob": "*", "codec": {"name": "fp16", "params": {"ratoi": "1"}}}
  ]}})");
  auto config = LoadConfig(path, FlagOverrides(), codecs::BuiltinCodecs());
  ASSERT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(config.status().message(), HasSubstr("policy rule 0"));
  EXPECT_THAT(config.status().message(), HasSubstr("ratoi"));
}

TEST(ConfigTest, SeveralWorkersNeedOnePeerAddressPerRank) {
  FlagOverrides flags;
  flags.world_size = 2;
  flags.rank = 1;
  auto config = LoadConfig("", flags, codecs::BuiltinCodecs());
  ASSERT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(config.status().message(),
              HasSubstr("world_size is 2 but peers is empty"));
  flags.peers = {{"h0:50052", "h1:50052"}};
  config = LoadConfig("", flags, codecs::BuiltinCodecs());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->world_size(), 2u);
  EXPECT_EQ(config->peers(1), "h1:50052");
}

// gRPC's URI form "unix:///abs" names the path "/abs": its length is the
// path's, as for "unix:/abs" (it counted the two extra slashes).
TEST(ConfigTest, AUnixSocketPathIsCountedAsGrpcReadsIt) {
  const std::string path = "/" + std::string(106, 'a');  // 107 bytes
  for (const std::string& listen : {"unix:" + path, "unix://" + path}) {
    FlagOverrides flags;
    flags.listen = listen;
    auto config = LoadConfig("", flags, codecs::BuiltinCodecs());
    EXPECT_TRUE(config.ok()) << listen << ": " << config.status();
  }
  FlagOverrides flags;
  flags.listen = "unix://" + path + "a";
  auto config = LoadConfig("", flags, codecs::BuiltinCodecs());
  EXPECT_THAT(config.status().message(),
              HasSubstr("socket path has 108 bytes, expected at most 107"));
}

TEST(ConfigTest, ScheduledPoliciesLoadAndAreChecked) {
  auto config = LoadConfig(
      WriteFile("schedule.textproto",
                "scheduled_policies { from_step: 100 policy { default_codec "
                "{ name: 'qsgd' } } }\n"
                "scheduled_policies { from_step: 200 policy { default_codec "
                "{ name: 'topk' params { key: 'ratio' value: '0.01' } } } }\n"),
      FlagOverrides(), codecs::BuiltinCodecs());
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_EQ(config->scheduled_policies_size(), 2);
  EXPECT_EQ(config->scheduled_policies(1).from_step(), 200);
  EXPECT_EQ(config->scheduled_policies(1).policy().default_codec().name(),
            "topk");
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"scheduled_policies { from_step: 100 }\n"
       "scheduled_policies { from_step: 100 }\n",
       "scheduled_policies[1].from_step is 100, expected a step >= 0 and "
       "above the entry before's (100)"},
      {"scheduled_policies { from_step: -1 }\n",
       "scheduled_policies[0].from_step is -1"},
      {"scheduled_policies { from_step: 5 policy { default_codec { name: "
       "'nosuch' } } }\n",
       "scheduled_policies[0]: "},
  };
  for (const auto& [text, message] : bad) {
    auto refused = LoadConfig(WriteFile("bad-schedule.textproto", text),
                              FlagOverrides(), codecs::BuiltinCodecs());
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument)
        << text;
    EXPECT_THAT(refused.status().message(), HasSubstr(message)) << text;
  }
}

TEST(ConfigTest, InvalidFieldsAreNamed) {
  struct Case {
    std::function<void(FlagOverrides&)> set;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](FlagOverrides& f) { f.listen = "nohost"; },
       "listen is 'nohost', expected host:port"},
      {[](FlagOverrides& f) { f.listen = "unix:"; }, "unix:/path/to.sock"},
      {[](FlagOverrides& f) { f.listen = "unix:/" + std::string(200, 'a'); },
       "socket path has 201 bytes, expected at most 107"},
      {[](FlagOverrides& f) { f.metrics_listen = "unix:/m.sock"; },
       "Prometheus scrapes over TCP"},
      {[](FlagOverrides& f) { f.world_size = 0; }, "world_size is 0"},
      {[](FlagOverrides& f) { f.rank = 1; },
       "rank is 1, expected < world_size 1"},
      {[](FlagOverrides& f) {
         f.peers = {{"a:1", "b:2"}};
       },
       "peers lists 2 addresses"},
      {[](FlagOverrides& f) {
         f.world_size = 2;
         f.peers = {{"h0:1", "nohost"}};
       },
       "peers[1] is 'nohost', expected host:port"},
      {[](FlagOverrides& f) {
         f.world_size = 2;
         f.peers = {{"h0:1", "b:abc"}};
       },
       "peers[1] is 'b:abc': port 'abc' is not a number in 1-65535"},
      {[](FlagOverrides& f) {
         f.world_size = 2;
         f.peers = {{"h0:0", "h1:1"}};
       },
       "peers[0] is 'h0:0': port '0' is not a number in 1-65535"},
      {[](FlagOverrides& f) {
         f.world_size = 2;
         f.peers = {{"h0:1", "h1:99999"}};
       },
       "peers[1] is 'h1:99999': port '99999' is not a number in 1-65535"},
      {[](FlagOverrides& f) { f.listen = "127.0.0.1:+80"; },
       "listen is '127.0.0.1:+80': port '+80' is not a number in 0-65535 "
       "(0: any free port)"},
      {[](FlagOverrides& f) { f.metrics_listen = "0.0.0.0:65536"; },
       "metrics_listen is '0.0.0.0:65536': port '65536' is not a number"},
      {[](FlagOverrides& f) {
         f.world_size = 2;
         f.peers = {{"h0:1", "unix:/p.sock"}};
       },
       "peers[1] is 'unix:/p.sock', expected host:port"},
      {[](FlagOverrides& f) {
         f.world_size = 3;
         f.peers = {{"h0:1", "h1:1", "h0:1"}};
       },
       "peers[0] and peers[2] are both 'h0:1', expected each rank's own peer "
       "address"},
      {[](FlagOverrides& f) {
         f.world_size = 2;
         f.listen = "127.0.0.1:7001";
         f.peers = {{"127.0.0.1:7000", "127.0.0.1:7001"}};
       },
       "listen is '127.0.0.1:7001', the same as peers[1]"},
      {[](FlagOverrides& f) {
         f.world_size = 2;
         f.metrics_listen = "127.0.0.1:7000";
         f.peers = {{"127.0.0.1:7000", "127.0.0.1:7001"}};
       },
       "metrics_listen is '127.0.0.1:7000', the same as peers[0]"},
      {[](FlagOverrides& f) {
         f.world_size = 2;
         f.peers = {{"h0:1",
                     "10.0.0.1:500\x86"
                     "52"}};
       },
       "peers[1] is not valid UTF-8: byte 0x86 at offset 12"},
  };
  for (const Case& c : cases) {
    FlagOverrides flags;
    c.set(flags);
    auto config = LoadConfig("", flags, codecs::BuiltinCodecs());
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument)
        << c.message;
    EXPECT_THAT(config.status().message(), HasSubstr(c.message));
  }
}

TEST(ConfigTest, InvalidUtf8InATextFormatFileIsRefusedNamingTheField) {
  // The text-format parser takes any bytes in a string; the JSON printer of
  // --check_config could not print them (found by config_fuzzer).
  const std::string path =
      WriteFile("bad_utf8.txtpb",
                "world_size: 2 peers: \"h0:50052\" peers: \"h1:500\x86"
                "52\"\n"
                "policy { rules { name_glob: \"fc\xC0\x83\" } }\n");
  auto config = LoadConfig(path, FlagOverrides(), codecs::BuiltinCodecs());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(config.status().message(),
              HasSubstr("peers[1] is not valid UTF-8: byte 0x86 at offset 6"));

  const std::string glob = WriteFile(
      "bad_glob.txtpb", "policy { rules { name_glob: \"fc\xC0\x83\" } }\n");
  config = LoadConfig(glob, FlagOverrides(), codecs::BuiltinCodecs());
  EXPECT_THAT(config.status().message(),
              HasSubstr("policy.rules[0].name_glob is not valid UTF-8: byte "
                        "0xC0 at offset 2"));
}

TEST(ConfigTest, JsonOfTheEffectiveConfigLoadsBackTheSame) {
  auto config = LoadConfig("", FlagOverrides(), codecs::BuiltinCodecs());
  ASSERT_TRUE(config.ok());
  const std::string json = ConfigToJson(*config);
  EXPECT_THAT(json, HasSubstr("\"dense_below_numel\": \"1024\""));
  EXPECT_THAT(json,
              HasSubstr("\"listen\": \"unix:/run/gradcomp/gradcomp.sock\""));
  auto again = LoadConfig(WriteFile("again.json", json), FlagOverrides(),
                          codecs::BuiltinCodecs());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->SerializeAsString(), config->SerializeAsString());
}

TEST(ConfigTest, LimitsHaveDefaultsFileFieldsFlagsAndChecks) {
  auto defaults = LoadConfig("", FlagOverrides(), codecs::BuiltinCodecs());
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  EXPECT_EQ(defaults->memory_budget_bytes(), DefaultMemoryBudgetBytes());
  EXPECT_EQ(defaults->memory_wait_seconds(), 10);
  EXPECT_EQ(defaults->max_concurrent_jobs(), 16u);
  EXPECT_EQ(defaults->max_tensors_per_job(), 65536u);
  EXPECT_EQ(defaults->max_state_bytes_per_job(), 0u);
  EXPECT_EQ(defaults->max_queued_requests(), 4096u);
  EXPECT_EQ(defaults->max_rpc_threads(), 1024u);

  const std::string path = WriteFile("limits.json", R"({
    "memory_budget_bytes": "1048576", "memory_wait_seconds": 0,
    "max_concurrent_jobs": "2", "max_state_bytes_per_job": "4096"})");
  FlagOverrides flags;
  flags.max_tensors_per_job = 3;
  flags.max_queued_requests = 5;
  flags.max_rpc_threads = 8;
  flags.max_tensor_bytes = 1024;
  auto config = LoadConfig(path, flags, codecs::BuiltinCodecs());
  ASSERT_TRUE(config.ok()) << config.status();
  const EngineOptions options = EngineOptionsFromConfig(*config);
  EXPECT_EQ(options.memory_budget_bytes, 1u << 20);
  EXPECT_EQ(options.memory_wait, absl::ZeroDuration());
  EXPECT_EQ(options.quotas.max_concurrent_jobs, 2u);
  EXPECT_EQ(options.quotas.max_tensors_per_job, 3u);
  EXPECT_EQ(options.quotas.max_state_bytes_per_job, 4096u);
  EXPECT_EQ(options.max_tensor_bytes, 1024u);
  EXPECT_EQ(config->max_queued_requests(), 5u);
  EXPECT_EQ(config->max_rpc_threads(), 8u);

  flags.max_queued_requests = 0;
  EXPECT_THAT(
      LoadConfig(path, flags, codecs::BuiltinCodecs()).status().message(),
      HasSubstr("max_queued_requests is 0, expected a positive number"));
  flags.max_queued_requests = 5;
  flags.max_rpc_threads = 1;
  EXPECT_THAT(
      LoadConfig(path, flags, codecs::BuiltinCodecs()).status().message(),
      HasSubstr("max_rpc_threads is 1, expected at least 2"));
  // --memory_budget_bytes=0, the default --helpfull shows, is the
  // default: the file's budget, else half of the memory (it was refused).
  FlagOverrides zero_budget;
  zero_budget.memory_budget_bytes = 0;
  auto from_file = LoadConfig(path, zero_budget, codecs::BuiltinCodecs());
  ASSERT_TRUE(from_file.ok()) << from_file.status();
  EXPECT_EQ(from_file->memory_budget_bytes(), 1u << 20);
  auto from_default = LoadConfig("", zero_budget, codecs::BuiltinCodecs());
  ASSERT_TRUE(from_default.ok()) << from_default.status();
  EXPECT_EQ(from_default->memory_budget_bytes(), DefaultMemoryBudgetBytes());

  FlagOverrides negative;
  negative.memory_wait_seconds = -1;
  EXPECT_THAT(
      LoadConfig("", negative, codecs::BuiltinCodecs()).status().message(),
      HasSubstr("memory_wait_seconds is -1, expected seconds in [0, 86400]"));
}

}  // namespace
}  // namespace gradcomp::service
