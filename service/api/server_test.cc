#include "service/api/server.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gradcomp/v1/gradcomp.grpc.pb.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"

namespace gradcomp::service {
namespace {

using ::testing::HasSubstr;

// No RPC is called: the tests are about binding, which needs a service.
class EmptyService : public gradcomp::v1::Gradcomp::Service {};

TEST(ServerTest, PortZeroPicksAFreePort) {
  EmptyService service;
  int port = 0;
  auto server = StartGrpcServer("127.0.0.1:0", &service, &port);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_GT(port, 0);
  (*server)->Shutdown();
}

TEST(ServerTest, ATakenPortIsAnErrorNotASharedPort) {
  EmptyService first_service, second_service;
  int port = 0;
  auto first = StartGrpcServer("127.0.0.1:0", &first_service, &port);
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string taken = "127.0.0.1:" + std::to_string(port);
  auto second = StartGrpcServer(taken, &second_service);
  ASSERT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(), HasSubstr(taken));
  (*first)->Shutdown();
}

// Answers SetPolicy OK, whatever the policy: only the size matters here.
class PolicyService : public gradcomp::v1::Gradcomp::Service {
  grpc::Status SetPolicy(grpc::ServerContext*,
                         const gradcomp::v1::SetPolicyRequest*,
                         gradcomp::v1::SetPolicyResponse*) override {
    return grpc::Status::OK;
  }
};

TEST(ServerTest, MessagesOverTheReceiveLimitAreRefused) {
  PolicyService service;
  int port = 0;
  auto server = StartGrpcServer("127.0.0.1:0", &service, &port, nullptr,
                                /*max_receive_bytes=*/1024);
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = gradcomp::v1::Gradcomp::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  gradcomp::v1::SetPolicyRequest small, large;
  large.mutable_policy()->add_rules()->set_name_glob(std::string(2048, 'x'));
  gradcomp::v1::SetPolicyResponse response;
  {
    grpc::ClientContext context;
    EXPECT_TRUE(stub->SetPolicy(&context, small, &response).ok());
  }
  grpc::ClientContext context;
  const grpc::Status refused = stub->SetPolicy(&context, large, &response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << refused.error_message();
  (*server)->Shutdown();
}

TEST(ServerTest, UnixSocket) {
  EmptyService service;
  // TEST_TMPDIR is too long for a socket path (107 bytes at most).
  char dir[] = "/tmp/gradcomp-server-test-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/gradcompd.sock";
  auto server = StartGrpcServer("unix:" + path, &service);
  ASSERT_TRUE(server.ok()) << server.status();
  struct stat st;
  EXPECT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  (*server)->Shutdown();
  unlink(path.c_str());
  rmdir(dir);
}

// Each ReduceStream holds a thread while it runs: here until released.
class HoldingService : public gradcomp::v1::Gradcomp::Service {
 public:
  grpc::Status ReduceStream(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<gradcomp::v1::ReduceStreamResponse,
                               gradcomp::v1::ReduceRequest>* stream) override {
    gradcomp::v1::ReduceRequest request;
    stream->Read(&request);
    ++holding;
    release.WaitForNotification();
    return grpc::Status::OK;
  }
  std::atomic<int> holding{0};
  absl::Notification release;
};

// With 3 threads (one waits for calls), two streams are served and a third
// is refused at once, not queued behind them or given a thread of its own.
TEST(ServerTest, CallsBeyondTheThreadBoundAreRefusedAtOnce) {
  HoldingService service;
  int port = 0;
  auto server = StartGrpcServer("127.0.0.1:0", &service, &port, nullptr,
                                INT_MAX, /*max_threads=*/3);
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = gradcomp::v1::Gradcomp::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  using Stream = grpc::ClientReaderWriter<gradcomp::v1::ReduceRequest,
                                          gradcomp::v1::ReduceStreamResponse>;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<Stream>> streams;
  auto open = [&] {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    contexts.back()->set_deadline(std::chrono::system_clock::now() +
                                  std::chrono::seconds(60));
    streams.push_back(stub->ReduceStream(contexts.back().get()));
    streams.back()->Write(gradcomp::v1::ReduceRequest());
    return streams.back().get();
  };
  open();
  open();
  while (service.holding < 2) absl::SleepFor(absl::Milliseconds(5));
  Stream* third = open();
  const grpc::Status refused = third->Finish();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(), HasSubstr("Threadpool Exhausted"));
  EXPECT_EQ(service.holding, 2);

  service.release.Notify();
  EXPECT_TRUE(streams[0]->Finish().ok());
  EXPECT_TRUE(streams[1]->Finish().ok());
  Stream* later = open();  // threads came free
  later->WritesDone();
  EXPECT_TRUE(later->Finish().ok());
  (*server)->Shutdown();
}

// The probe address answers health and nothing else: a client API call
// there is UNIMPLEMENTED, whoever makes it.
TEST(ServerTest, TheHealthServerServesHealthOnly) {
  int port = 0;
  auto health = StartHealthServer("127.0.0.1:0", &port);
  ASSERT_TRUE(health.ok()) << health.status();
  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                     grpc::InsecureChannelCredentials());
  grpc::GenericStub generic(channel);
  auto call = [&](const std::string& method) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(10));
    grpc::ByteBuffer request(nullptr, 0), response;
    std::promise<grpc::Status> done;
    generic.UnaryCall(
        &context, method, grpc::StubOptions(), &request, &response,
        [&done](grpc::Status s) { done.set_value(std::move(s)); });
    return done.get_future().get();
  };
  EXPECT_TRUE(call("/grpc.health.v1.Health/Check").ok());
  (*health)->GetHealthCheckService()->SetServingStatus(false);
  EXPECT_EQ(call("/grpc.health.v1.Health/Check").error_code(),
            grpc::StatusCode::OK);  // answered; the body says NOT_SERVING
  EXPECT_EQ(call("/gradcomp.v1.Gradcomp/GetInfo").error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
  (*health)->Shutdown();
}

}  // namespace
}  // namespace gradcomp::service
