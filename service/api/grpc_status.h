// The one place where an absl::Status becomes a grpc::Status. The codes are
// the same google.rpc.Code values on both sides; the message is kept as is.
//
//   return ToGrpcStatus(engine.SetPolicy(policy).status());
#ifndef GRADCOMP_SERVICE_API_GRPC_STATUS_H_
#define GRADCOMP_SERVICE_API_GRPC_STATUS_H_

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace gradcomp::service {

grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_API_GRPC_STATUS_H_
