// Serves a Collectable at http://<address>/metrics for Prometheus.
//
//   GC_ASSIGN_OR_RETURN(auto exposer,
//                       StartMetricsServer("127.0.0.1:9464",
//                       metrics.collectable()));
#ifndef GRADCOMP_SERVICE_METRICS_METRICS_SERVER_H_
#define GRADCOMP_SERVICE_METRICS_METRICS_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "prometheus/collectable.h"
#include "prometheus/exposer.h"

namespace gradcomp::service {

// Binds `address` ("host:port"; port 0 picks a free one, see
// Exposer::GetListeningPorts) and serves `collectable` until the returned
// exposer is destroyed. Unavailable, naming the address, if it cannot bind.
absl::StatusOr<std::unique_ptr<prometheus::Exposer>> StartMetricsServer(
    const std::string& address,
    std::shared_ptr<prometheus::Collectable> collectable);

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_METRICS_METRICS_SERVER_H_
