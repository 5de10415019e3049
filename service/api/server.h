// Builds and starts the daemon's gRPC server around a service: the standard
// grpc.health.v1 service (SERVING once started), server reflection, and no
// 4 MiB message cap (tensors travel inline up to 2 GiB; larger ones will
// travel in chunks once ReduceStream chunking and peers exist).
//
//   GC_ASSIGN_OR_RETURN(std::unique_ptr<grpc::Server> server,
//                       StartGrpcServer("127.0.0.1:0", &service, &port));
#ifndef GRADCOMP_SERVICE_API_SERVER_H_
#define GRADCOMP_SERVICE_API_SERVER_H_

#include <climits>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "service/metrics/metrics.h"

namespace gradcomp::service {

// `listen` is "host:port" (port 0 picks a free one, written to `port` if
// not null) or "unix:/path". Unavailable, naming the address, if it cannot
// bind, or if a process listens on that unix socket (RefuseSocketInUse;
// a socket file nothing listens on is replaced). With `metrics`, every call is
// counted in gradcomp_requests_total. A received message over
// `max_receive_bytes` is refused by gRPC with RESOURCE_EXHAUSTED from its
// length prefix, before it is buffered. Health probes on another address have a
// server of their own (StartHealthServer). gRPC serves calls on at most
// `max_threads` threads, one of which waits for new calls: a call beyond them
// is refused at once with RESOURCE_EXHAUSTED ("Server Threadpool Exhausted")
// rather than the daemon starting threads without end (each ReduceStream holds
// one for its life).
absl::StatusOr<std::unique_ptr<grpc::Server>> StartGrpcServer(
    const std::string& listen, grpc::Service* service, int* port = nullptr,
    Metrics* metrics = nullptr, int max_receive_bytes = INT_MAX,
    int max_threads = 1024);

// A server on `listen` (host:port) that answers grpc.health.v1 only, for
// kubelet gRPC probes, which reach the pod IP and cannot use a unix socket
// (and server reflection, a process-wide plugin, which lists just that).
// Nothing else is served there: not the client API, whose loopback rule a
// proxy in the pod (a service mesh's sidecar connects from 127.0.0.6)
// would otherwise pass. Its status is set apart from the API server's.
absl::StatusOr<std::unique_ptr<grpc::Server>> StartHealthServer(
    const std::string& listen, int* port = nullptr);

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_API_SERVER_H_
