#include "service/api/grpc_status.h"

#include "gtest/gtest.h"

namespace gradcomp::service {
namespace {

TEST(GrpcStatusTest, OkStaysOk) {
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
}

TEST(GrpcStatusTest, CodesAndMessagesCarryOver) {
  const struct {
    absl::Status in;
    grpc::StatusCode code;
  } cases[] = {
      {absl::InvalidArgumentError("bad"), grpc::StatusCode::INVALID_ARGUMENT},
      {absl::NotFoundError("gone"), grpc::StatusCode::NOT_FOUND},
      {absl::ResourceExhaustedError("big"),
       grpc::StatusCode::RESOURCE_EXHAUSTED},
      {absl::UnimplementedError("later"), grpc::StatusCode::UNIMPLEMENTED},
      {absl::UnavailableError("down"), grpc::StatusCode::UNAVAILABLE},
      {absl::InternalError("bug"), grpc::StatusCode::INTERNAL},
      {absl::DeadlineExceededError("slow"),
       grpc::StatusCode::DEADLINE_EXCEEDED},
  };
  for (const auto& c : cases) {
    const grpc::Status out = ToGrpcStatus(c.in);
    EXPECT_EQ(out.error_code(), c.code) << c.in;
    EXPECT_EQ(out.error_message(), c.in.message());
  }
}

}  // namespace
}  // namespace gradcomp::service
