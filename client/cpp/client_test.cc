#include "client/cpp/client.h"

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"

namespace gradcomp::client {
namespace {

using ::testing::HasSubstr;

TEST(FromGrpcStatusTest, KeepsCodeAndNamesRpcAndTarget) {
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK, "Reduce", "h:1").ok());
  for (grpc::StatusCode code :
       {grpc::StatusCode::INVALID_ARGUMENT, grpc::StatusCode::NOT_FOUND,
        grpc::StatusCode::DEADLINE_EXCEEDED, grpc::StatusCode::UNAVAILABLE,
        grpc::StatusCode::UNIMPLEMENTED, grpc::StatusCode::RESOURCE_EXHAUSTED,
        grpc::StatusCode::FAILED_PRECONDITION}) {
    absl::Status status =
        FromGrpcStatus(grpc::Status(code, "bad shape"), "Reduce", "h:1");
    EXPECT_EQ(static_cast<int>(status.code()), static_cast<int>(code));
    EXPECT_EQ(status.message(), "Reduce to gradcompd at h:1: bad shape");
  }
}

TEST(DTypeSizeTest, Sizes) {
  EXPECT_EQ(DTypeSize(v1::DTYPE_FLOAT16), 2u);
  EXPECT_EQ(DTypeSize(v1::DTYPE_BFLOAT16), 2u);
  EXPECT_EQ(DTypeSize(v1::DTYPE_FLOAT32), 4u);
  EXPECT_EQ(DTypeSize(v1::DTYPE_FLOAT64), 8u);
  EXPECT_EQ(DTypeSize(v1::DTYPE_UNSPECIFIED), 0u);
}

TEST(ClientTest, ConnectRejectsEmptyTargetAndBadTimeout) {
  EXPECT_EQ(Client::Connect("").status().code(),
            absl::StatusCode::kInvalidArgument);
  ClientOptions options;
  options.rpc_timeout = absl::ZeroDuration();
  EXPECT_EQ(Client::Connect("127.0.0.1:1", options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// No daemon listens on this socket: the RPC fails as Unavailable, and the
// message says where the client looked. The directory is under /tmp because
// a unix socket path must fit in 107 bytes, which TEST_TMPDIR may not.
TEST(ClientTest, AbsentDaemonIsUnavailable) {
  char dir[] = "/tmp/gradcomp_client_test_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string target = absl::StrCat("unix:", dir, "/absent.sock");
  ClientOptions options;
  options.rpc_timeout = absl::Seconds(5);
  absl::StatusOr<std::unique_ptr<Client>> client =
      Client::Connect(target, options);
  ASSERT_TRUE(client.ok()) << client.status();
  absl::Status status = (*client)->GetInfo().status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(), HasSubstr(target));

  const std::vector<float> values = {1, 2};
  const std::vector<int64_t> shape = {2};
  status = (*client)->Reduce("j", "t", 0, values, shape).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(), HasSubstr("Reduce to gradcompd"));
  rmdir(dir);
}

// A Gradcomp server that records the Reduce requests it gets and answers
// each with its input doubled, so a test sees both what the client sent and
// that the answer came back.
class RecordingServer final : public v1::Gradcomp::Service {
 public:
  RecordingServer() {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port_);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
  }
  ~RecordingServer() override { server_->Shutdown(); }

  std::string target() const { return absl::StrCat("127.0.0.1:", port_); }
  std::vector<v1::ReduceRequest> requests() {
    absl::MutexLock lock(&mu_);
    return requests_;
  }

  grpc::Status Reduce(grpc::ServerContext*, const v1::ReduceRequest* request,
                      v1::ReduceResponse* response) override {
    {
      absl::MutexLock lock(&mu_);
      requests_.push_back(*request);
    }
    std::vector<float> values(request->data().size() / sizeof(float));
    std::memcpy(values.data(), request->data().data(), request->data().size());
    for (float& v : values) v *= 2;
    response->set_dtype(request->dtype());
    response->set_data(values.data(), values.size() * sizeof(float));
    response->mutable_stats()->set_codec("gossip");
    return grpc::Status::OK;
  }

 private:
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  absl::Mutex mu_;
  std::vector<v1::ReduceRequest> requests_ ABSL_GUARDED_BY(mu_);
};

v1::GossipSpec TorusSpec() {
  v1::GossipSpec spec;
  spec.set_topology("torus:2x2");
  spec.set_rank(2);
  spec.set_power_steps(3);
  spec.set_diffusion(1.308);
  return spec;
}

TEST(ClientGossipTest, SetsTheGossipFieldsAndReturnsTheMixedValues) {
  RecordingServer server;
  auto client = Client::Connect(server.target());
  ASSERT_TRUE(client.ok()) << client.status();
  const std::vector<float> values = {1, -2, 3.5, 4, 5, 6};
  const std::vector<int64_t> shape = {2, 3};
  auto out = (*client)->Gossip("job", "fc.weight", 7, values, shape,
                               TorusSpec(), /*consensus_distance=*/0.25);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->values, std::vector<float>({2, -4, 7, 8, 10, 12}));
  EXPECT_EQ(out->stats.codec(), "gossip");

  const std::vector<v1::ReduceRequest> requests = server.requests();
  ASSERT_EQ(requests.size(), 1u);
  const v1::ReduceRequest& r = requests[0];
  EXPECT_EQ(r.mode(), v1::REDUCE_MODE_GOSSIP);
  EXPECT_EQ(r.gossip().SerializeAsString(), TorusSpec().SerializeAsString());
  EXPECT_EQ(r.consensus_distance(), 0.25);
  EXPECT_EQ(r.job(), "job");
  EXPECT_EQ(r.tensor(), "fc.weight");
  EXPECT_EQ(r.step(), 7);
  EXPECT_EQ(r.dtype(), v1::DTYPE_FLOAT32);
  EXPECT_EQ(std::vector<int64_t>(r.shape().begin(), r.shape().end()), shape);
  EXPECT_EQ(r.data(), std::string(reinterpret_cast<const char*>(values.data()),
                                  values.size() * sizeof(float)));
  EXPECT_FALSE(r.has_codec());
}

TEST(ClientGossipTest, PlainReduceLeavesTheAverageMode) {
  RecordingServer server;
  auto client = Client::Connect(server.target());
  ASSERT_TRUE(client.ok()) << client.status();
  const std::vector<float> values = {1, 2};
  const std::vector<int64_t> shape = {2};
  ASSERT_TRUE((*client)->Reduce("job", "b", 0, values, shape).ok());
  const std::vector<v1::ReduceRequest> requests = server.requests();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].mode(), v1::REDUCE_MODE_AVERAGE);
  EXPECT_FALSE(requests[0].has_gossip());
  EXPECT_EQ(requests[0].consensus_distance(), 0);
}

TEST(ClientGossipTest, BadSpecsAreRefusedBeforeAnythingIsSent) {
  RecordingServer server;
  auto client = Client::Connect(server.target());
  ASSERT_TRUE(client.ok()) << client.status();
  const std::vector<float> values = {1, 2};
  const std::vector<int64_t> shape = {2};
  struct Case {
    v1::GossipSpec spec;
    double distance;
    std::string message;
  };
  std::vector<Case> cases;
  cases.push_back({TorusSpec(), 0, "empty topology; expected ring, torus"});
  cases.back().spec.clear_topology();
  cases.push_back({TorusSpec(), 0, "diffusion -0.5; expected a finite value"});
  cases.back().spec.set_diffusion(-0.5);
  cases.push_back({TorusSpec(), 0, "diffusion nan; expected a finite value"});
  cases.back().spec.set_diffusion(std::nan(""));
  cases.push_back(
      {TorusSpec(), -1, "consensus distance -1; expected a finite value"});
  cases.push_back(
      {TorusSpec(), HUGE_VAL, "consensus distance inf; expected a finite"});
  for (const Case& c : cases) {
    absl::Status status =
        (*client)
            ->Gossip("job", "w", 0, values, shape, c.spec, c.distance)
            .status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(status.message(), HasSubstr("Gossip of 'w': " + c.message));
  }
  EXPECT_TRUE(server.requests().empty());
}

}  // namespace
}  // namespace gradcomp::client
