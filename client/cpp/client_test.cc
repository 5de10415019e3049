#include "client/cpp/client.h"

#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
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

}  // namespace
}  // namespace gradcomp::client
