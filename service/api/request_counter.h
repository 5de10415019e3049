// Counts every finished call of the daemon's client API server in
// gradcomp_requests_total{service, method, code}, in one place for every
// RPC (health and reflection included) instead of in each handler.
//
//   builder.experimental().SetInterceptorCreators(
//       RequestCounterInterceptors(&metrics));
#ifndef GRADCOMP_SERVICE_API_REQUEST_COUNTER_H_
#define GRADCOMP_SERVICE_API_REQUEST_COUNTER_H_

#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "grpcpp/support/server_interceptor.h"
#include "service/metrics/metrics.h"

namespace gradcomp::service {

// "/gradcomp.v1.Gradcomp/Reduce" -> {"gradcomp.v1.Gradcomp", "Reduce"}.
// Labels stay a bounded set: a service outside the daemon's own
// (gradcomp.v1.Gradcomp, grpc.health.v1.Health, server reflection) becomes
// {"other", "other"}, whatever a client asks for.
std::pair<absl::string_view, absl::string_view> RequestLabels(
    absl::string_view full_method);

// Interceptor creators for grpc::ServerBuilder; `metrics` must outlive the
// server. A call is counted once, with the status the server sends.
std::vector<
    std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
RequestCounterInterceptors(Metrics* metrics);

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_API_REQUEST_COUNTER_H_
