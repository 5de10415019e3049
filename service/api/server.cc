#include "service/api/server.h"

#include <climits>

#include "absl/strings/str_cat.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/resource_quota.h"
#include "service/api/request_counter.h"

namespace gradcomp::service {

absl::StatusOr<std::unique_ptr<grpc::Server>> StartGrpcServer(
    const std::string& listen, grpc::Service* service, int* port,
    Metrics* metrics, int max_receive_bytes, int max_threads) {
  // Both are process-wide switches read when a server is built.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();

  grpc::ServerBuilder builder;
  int bound_port = 0;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(),
                           &bound_port);
  builder.RegisterService(service);
  // gRPC's ceiling is INT_MAX bytes per message (2 GiB - 1).
  builder.SetMaxReceiveMessageSize(max_receive_bytes);
  builder.SetMaxSendMessageSize(INT_MAX);
  // gRPC sets SO_REUSEPORT by default, which lets a second daemon bind the
  // same port and silently share its traffic; a taken port must fail.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  grpc::ResourceQuota threads("gradcompd client API");
  threads.SetMaxThreads(max_threads);
  builder.SetResourceQuota(threads);
  if (metrics != nullptr) {
    builder.experimental().SetInterceptorCreators(
        RequestCounterInterceptors(metrics));
  }
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) {
    return absl::UnavailableError(absl::StrCat(
        "cannot serve gRPC on '", listen,
        "': the address is invalid or already in use (expected a free "
        "host:port or unix:/path)"));
  }
  if (port != nullptr) *port = bound_port;
  return server;
}

absl::StatusOr<std::unique_ptr<grpc::Server>> StartHealthServer(
    const std::string& listen, int* port) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int bound_port = 0;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(),
                           &bound_port);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Probes are small and few.
  grpc::ResourceQuota threads("gradcompd health");
  threads.SetMaxThreads(4);
  builder.SetResourceQuota(threads);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) {
    return absl::UnavailableError(absl::StrCat(
        "cannot serve gRPC health on '", listen,
        "': the address is invalid or already in use (expected a free "
        "host:port)"));
  }
  if (port != nullptr) *port = bound_port;
  return server;
}

}  // namespace gradcomp::service
