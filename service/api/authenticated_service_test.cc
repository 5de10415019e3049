#include "service/api/authenticated_service.h"

#include <stdlib.h>
#include <unistd.h>

#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gradcomp/v1/gradcomp.grpc.pb.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "service/api/server.h"
#include "service/metrics/metrics_testing.h"

namespace gradcomp::service {
namespace {

using ::testing::HasSubstr;

constexpr char kToken[] = "a-real-token-of-32-bytes-0123456";

// Answers GetInfo and echoes a stream: enough to tell served from refused.
class InnerService : public v1::Gradcomp::Service {
 public:
  grpc::Status GetInfo(grpc::ServerContext*, const v1::GetInfoRequest*,
                       v1::GetInfoResponse* response) override {
    response->set_version("inner");
    return grpc::Status::OK;
  }
  grpc::Status ReduceStream(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<v1::ReduceStreamResponse, v1::ReduceRequest>*
          stream) override {
    v1::ReduceRequest request;
    while (stream->Read(&request)) {
      v1::ReduceStreamResponse response;
      response.set_tensor(request.tensor());
      stream->Write(response);
    }
    return grpc::Status::OK;
  }
};

class AuthenticatedServiceTest : public ::testing::Test {
 protected:
  // A real server on `listen` ("host:0" or unix:) around InnerService.
  void Start(const std::string& listen, ClientAuthOptions options) {
    guarded_ =
        std::make_unique<AuthenticatedService>(&inner_, ClientAuth(options));
    int port = 0;
    auto server = StartGrpcServer(listen, guarded_.get(), &port, &metrics_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    target_ =
        absl::StartsWith(listen, "unix:")
            ? listen
            : absl::StrCat(listen.substr(0, listen.rfind(':')), ":", port);
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
  }

  // GetInfo with `authorization` metadata unless it is empty.
  grpc::Status GetInfo(const std::string& authorization) {
    auto stub = v1::Gradcomp::NewStub(
        grpc::CreateChannel(target_, grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    if (!authorization.empty()) {
      context.AddMetadata("authorization", authorization);
    }
    v1::GetInfoResponse response;
    grpc::Status status = stub->GetInfo(&context, {}, &response);
    if (status.ok()) {
      EXPECT_EQ(response.version(), "inner");
    }
    return status;
  }

  double Refused() {
    return MetricValue(*metrics_.collectable(), "gradcomp_requests_total",
                       {{"service", "gradcomp.v1.Gradcomp"},
                        {"method", "GetInfo"},
                        {"code", "UNAUTHENTICATED"}});
  }

  Metrics metrics_{nullptr, "test"};
  InnerService inner_;
  std::unique_ptr<AuthenticatedService> guarded_;
  std::unique_ptr<grpc::Server> server_;
  std::string target_;
};

TEST_F(AuthenticatedServiceTest, TcpNeedsTheRightTokenAndRefusalsAreCounted) {
  ClientAuthOptions options;
  options.token = kToken;
  Start("127.0.0.1:0", options);

  const grpc::Status none = GetInfo("");
  EXPECT_EQ(none.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(none.error_message(), HasSubstr("Bearer <token>"));
  EXPECT_EQ(GetInfo("Bearer not-the-token").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(GetInfo(kToken).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(GetInfo(absl::StrCat("Bearer ", kToken)).ok());
  EXPECT_EQ(Refused(), 3);
}

TEST_F(AuthenticatedServiceTest, StreamsAreCheckedToo) {
  ClientAuthOptions options;
  options.token = kToken;
  Start("127.0.0.1:0", options);
  auto stub = v1::Gradcomp::NewStub(
      grpc::CreateChannel(target_, grpc::InsecureChannelCredentials()));
  for (const bool with_token : {false, true}) {
    grpc::ClientContext context;
    if (with_token) {
      context.AddMetadata("authorization", absl::StrCat("Bearer ", kToken));
    }
    auto stream = stub->ReduceStream(&context);
    v1::ReduceRequest request;
    request.set_tensor("w");
    stream->Write(request);
    stream->WritesDone();
    v1::ReduceStreamResponse response;
    const bool read = stream->Read(&response);
    const grpc::Status status = stream->Finish();
    EXPECT_EQ(read, with_token);
    EXPECT_EQ(status.error_code(), with_token
                                       ? grpc::StatusCode::OK
                                       : grpc::StatusCode::UNAUTHENTICATED);
  }
}

TEST_F(AuthenticatedServiceTest, HealthStaysOpenForProbes) {
  ClientAuthOptions options;
  options.token = kToken;
  Start("127.0.0.1:0", options);
  grpc::ClientContext context;
  // An empty HealthCheckRequest asks about the whole server.
  grpc::Slice empty("");
  grpc::ByteBuffer request(&empty, 1), response;
  auto channel =
      grpc::CreateChannel(target_, grpc::InsecureChannelCredentials());
  grpc::GenericStub generic(channel);
  grpc::CompletionQueue cq;
  auto call = generic.PrepareUnaryCall(&context, "/grpc.health.v1.Health/Check",
                                       request, &cq);
  call->StartCall();
  grpc::Status status;
  call->Finish(&response, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  ASSERT_TRUE(cq.Next(&tag, &ok));
  EXPECT_TRUE(status.ok()) << status.error_message();
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
}

TEST_F(AuthenticatedServiceTest, UnixSocketNeedsNoToken) {
  char dir[] = "/tmp/gradcomp-auth-test-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  ClientAuthOptions options;
  options.token = kToken;
  Start(absl::StrCat("unix:", dir, "/gradcomp.sock"), options);
  EXPECT_TRUE(GetInfo("").ok());
  server_->Shutdown();
  server_ = nullptr;
  unlink(absl::StrCat(dir, "/gradcomp.sock").c_str());
  rmdir(dir);
}

TEST_F(AuthenticatedServiceTest, WithoutATokenLoopbackTcpIsServed) {
  Start("127.0.0.1:0", {});
  EXPECT_TRUE(GetInfo("").ok());
}

}  // namespace
}  // namespace gradcomp::service
