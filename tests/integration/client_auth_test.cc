// Client authentication of a real gradcompd process (docs/security.md,
// Client access): over TCP with --client_token_file a call without the
// token or with a wrong one is UNAUTHENTICATED and the right one is served;
// gRPC health stays open to probes without a token; over a unix socket the
// socket file's mode decides and no token is needed.
#include <sys/stat.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/free_port.h"
#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/integration/daemon_process.h"

namespace gradcomp::testing {
namespace {

using client::Client;
using client::ClientOptions;
using ::testing::HasSubstr;

constexpr char kToken[] = "s3cret-token-0123456789abcdef";

std::string TmpDir() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return tmp != nullptr ? tmp : "/tmp";
}

std::string WriteTokenFile() {
  const std::string path = TmpDir() + "/client_token";
  std::ofstream(path) << kToken << "\n";
  return path;
}

// Starts gradcompd with `args`; its readiness check sends kToken (the
// client reads $GRADCOMP_TOKEN when its own token is empty), which is unset
// again before the test's own clients connect.
std::unique_ptr<DaemonProcess> StartDaemon(
    const std::vector<std::string>& args) {
  auto binary = DaemonBinary();
  EXPECT_TRUE(binary.ok()) << binary.status();
  if (!binary.ok()) return nullptr;
  setenv("GRADCOMP_TOKEN", kToken, 1);
  auto daemon = DaemonProcess::Start(*binary, args);
  unsetenv("GRADCOMP_TOKEN");
  EXPECT_TRUE(daemon.ok()) << daemon.status();
  return daemon.ok() ? std::move(*daemon) : nullptr;
}

absl::Status GetInfoWithToken(const std::string& target,
                              const std::string& token) {
  ClientOptions options;
  options.rpc_timeout = absl::Seconds(10);
  options.token = token;
  auto client = Client::Connect(target, options);
  if (!client.ok()) return client.status();
  return (*client)->GetInfo().status();
}

// grpc.health.v1.Health/Check for the whole server, with no metadata. It
// waits for the server to listen: the daemon opens its health address
// after the API's, which is all that DaemonProcess waits for.
grpc::Status HealthCheck(const std::string& target) {
  grpc::GenericStub stub(
      grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_wait_for_ready(true);
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
  grpc::ByteBuffer request(nullptr, 0);  // HealthCheckRequest{service: ""}
  grpc::ByteBuffer response;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(),
                 &request, &response,
                 [&done](grpc::Status s) { done.set_value(std::move(s)); });
  return done.get_future().get();
}

TEST(ClientAuthTest, TcpCallsNeedTheToken) {
  std::unique_ptr<DaemonProcess> daemon =
      StartDaemon({absl::StrCat("--client_token_file=", WriteTokenFile())});
  ASSERT_NE(daemon, nullptr);

  const absl::Status none = GetInfoWithToken(daemon->target(), "");
  EXPECT_EQ(none.code(), absl::StatusCode::kUnauthenticated) << none;
  EXPECT_THAT(none.message(), HasSubstr("no 'authorization' metadata"));

  const absl::Status wrong =
      GetInfoWithToken(daemon->target(), "s3cret-token-0123456789abcdeX");
  EXPECT_EQ(wrong.code(), absl::StatusCode::kUnauthenticated) << wrong;
  EXPECT_THAT(wrong.message(), HasSubstr("does not match"));

  EXPECT_TRUE(GetInfoWithToken(daemon->target(), kToken).ok());

  // A reduce, not only GetInfo: the token admits the data path too, and
  // its absence keeps it shut.
  ClientOptions options;
  options.token = kToken;
  auto client = Client::Connect(daemon->target(), options);
  ASSERT_TRUE(client.ok()) << client.status();
  const std::vector<float> grad = {1.5f, -2.0f, 0.25f};
  auto reduced = (*client)->Reduce("job", "w", 0, grad, {3});
  ASSERT_TRUE(reduced.ok()) << reduced.status();
  EXPECT_EQ(reduced->values, grad);  // world_size 1: the mean is the input
  options.token.clear();
  auto anonymous = Client::Connect(daemon->target(), options);
  ASSERT_TRUE(anonymous.ok()) << anonymous.status();
  EXPECT_EQ((*anonymous)->Reduce("job", "w", 1, grad, {3}).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(daemon->Running()) << daemon->Log();
}

TEST(ClientAuthTest, HealthIsOpenWithoutAToken) {
  std::unique_ptr<DaemonProcess> daemon =
      StartDaemon({absl::StrCat("--client_token_file=", WriteTokenFile())});
  ASSERT_NE(daemon, nullptr);
  const grpc::Status health = HealthCheck(daemon->target());
  EXPECT_TRUE(health.ok()) << health.error_message();
}

// --health_listen is for probes: health answers there, and the client API
// does not, even from loopback (a mesh's sidecar proxies the pod IP's
// traffic from 127.0.0.6, which the loopback rule would let through).
TEST(ClientAuthTest, TheHealthAddressServesHealthOnly) {
  const int port = FreePort().value();
  const std::string probes = absl::StrCat("127.0.0.1:", port);
  std::unique_ptr<DaemonProcess> daemon =
      StartDaemon({absl::StrCat("--health_listen=", probes)});
  ASSERT_NE(daemon, nullptr);
  const grpc::Status health = HealthCheck(probes);
  EXPECT_TRUE(health.ok()) << health.error_message();
  EXPECT_EQ(GetInfoWithToken(probes, "").code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_TRUE(GetInfoWithToken(daemon->target(), "").ok());
}

TEST(ClientAuthTest, UnixSocketIsServedWithoutATokenAndHasItsMode) {
  // A short directory: a socket path has at most 107 bytes, which
  // $TEST_TMPDIR under Bazel's sandbox exceeds.
  char dir_template[] = "/tmp/gradcomp-auth-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  const std::string socket = dir + "/gradcompd.sock";
  // A token is configured, but it guards TCP only: on the socket the
  // file's mode decides who may connect.
  std::unique_ptr<DaemonProcess> daemon =
      StartDaemon({absl::StrCat("--listen=unix:", socket),
                   absl::StrCat("--client_token_file=", WriteTokenFile())});
  ASSERT_NE(daemon, nullptr);
  EXPECT_EQ(daemon->target(), "unix:" + socket);
  EXPECT_TRUE(GetInfoWithToken(daemon->target(), "").ok());
  struct stat st {};
  ASSERT_EQ(stat(socket.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0660u);  // the default --socket_mode
  daemon.reset();

  const std::string strict = dir + "/strict.sock";
  daemon = StartDaemon(
      {absl::StrCat("--listen=unix:", strict), "--socket_mode=0600"});
  ASSERT_NE(daemon, nullptr);
  ASSERT_EQ(stat(strict.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_TRUE(GetInfoWithToken(daemon->target(), "").ok());
  daemon.reset();
  std::filesystem::remove_all(dir);
}

TEST(ClientAuthTest, AnOpenTcpAddressWithoutATokenStopsTheDaemon) {
  auto binary = DaemonBinary();
  ASSERT_TRUE(binary.ok()) << binary.status();
  auto daemon =
      DaemonProcess::Start(*binary, {"--listen=0.0.0.0:0"}, absl::Seconds(20));
  ASSERT_FALSE(daemon.ok());
  EXPECT_THAT(daemon.status().message(), HasSubstr("--client_token_file"));
}

}  // namespace
}  // namespace gradcomp::testing
