#include "service/api/request_counter.h"

#include <memory>
#include <string>

#include "gradcomp/v1/gradcomp.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "service/api/server.h"
#include "service/metrics/metrics_testing.h"

namespace gradcomp::service {
namespace {

TEST(RequestLabelsTest, KnownMethodsKeepTheirNamesOthersAreBounded) {
  EXPECT_EQ(RequestLabels("/gradcomp.v1.Gradcomp/Reduce"),
            std::make_pair(absl::string_view("gradcomp.v1.Gradcomp"),
                           absl::string_view("Reduce")));
  EXPECT_EQ(RequestLabels("/grpc.health.v1.Health/Check"),
            std::make_pair(absl::string_view("grpc.health.v1.Health"),
                           absl::string_view("Check")));
  for (const char* other :
       {"/gradcomp.v1.Gradcomp/NoSuchMethod", "/x.Y/Z", "garbage", ""}) {
    EXPECT_EQ(RequestLabels(other), std::make_pair(absl::string_view("other"),
                                                   absl::string_view("other")))
        << other;
  }
}

// Every handler answers UNIMPLEMENTED: enough to see calls counted.
class EmptyService : public gradcomp::v1::Gradcomp::Service {};

TEST(RequestCounterTest, CountsEveryCallOnTheRealServer) {
  Metrics metrics(nullptr, "test");
  EmptyService service;
  int port = 0;
  auto server = StartGrpcServer("127.0.0.1:0", &service, &port, &metrics);
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = gradcomp::v1::Gradcomp::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  for (int i = 0; i < 2; ++i) {
    grpc::ClientContext context;
    gradcomp::v1::GetInfoResponse response;
    EXPECT_EQ(stub->GetInfo(&context, {}, &response).error_code(),
              grpc::StatusCode::UNIMPLEMENTED);
  }
  (*server)->Shutdown();
  EXPECT_EQ(MetricValue(*metrics.collectable(), "gradcomp_requests_total",
                        {{"service", "gradcomp.v1.Gradcomp"},
                         {"method", "GetInfo"},
                         {"code", "UNIMPLEMENTED"}}),
            2);
}

}  // namespace
}  // namespace gradcomp::service
