#include "service/api/server.h"

#include <climits>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/resource_quota.h"
#include "service/api/request_counter.h"
#include "service/api/unix_socket.h"

namespace gradcomp::service {
namespace {

// Listens on `listen` (the port bound goes to `port`) on at most
// `max_threads` threads and starts what `builder` holds; Unavailable naming
// `what`, the address and `expected` if it cannot bind.
absl::StatusOr<std::unique_ptr<grpc::Server>> ListenAndStart(
    grpc::ServerBuilder& builder, const std::string& listen, int max_threads,
    absl::string_view what, absl::string_view expected, int* port) {
  int bound_port = 0;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(),
                           &bound_port);
  // gRPC sets SO_REUSEPORT by default, which lets a second daemon bind the
  // same port and silently share its traffic; a taken port must fail.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  grpc::ResourceQuota threads(absl::StrCat("gradcompd ", what));
  threads.SetMaxThreads(max_threads);
  builder.SetResourceQuota(threads);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve ", what, " on '", listen,
                     "': the address is invalid or already in use (expected ",
                     expected, ")"));
  }
  if (port != nullptr) *port = bound_port;
  return server;
}

}  // namespace

absl::StatusOr<std::unique_ptr<grpc::Server>> StartGrpcServer(
    const std::string& listen, grpc::Service* service, int* port,
    Metrics* metrics, int max_receive_bytes, int max_threads) {
  // Both are process-wide switches read when a server is built.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();

  // gRPC unlinks a unix socket's file before it binds: a daemon already on
  // it would lose its clients without an error.
  GC_RETURN_IF_ERROR(RefuseSocketInUse(listen));
  grpc::ServerBuilder builder;
  builder.RegisterService(service);
  // gRPC's ceiling is INT_MAX bytes per message (2 GiB - 1).
  builder.SetMaxReceiveMessageSize(max_receive_bytes);
  builder.SetMaxSendMessageSize(INT_MAX);
  if (metrics != nullptr) {
    builder.experimental().SetInterceptorCreators(
        RequestCounterInterceptors(metrics));
  }
  return ListenAndStart(builder, listen, max_threads, "gRPC",
                        "a free host:port or unix:/path", port);
}

absl::StatusOr<std::unique_ptr<grpc::Server>> StartHealthServer(
    const std::string& listen, int* port) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  // Probes are small and few.
  return ListenAndStart(builder, listen, /*max_threads=*/4, "gRPC health",
                        "a free host:port", port);
}

}  // namespace gradcomp::service
