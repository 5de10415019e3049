#include "service/metrics/metrics_server.h"

#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"

namespace gradcomp::service {

absl::StatusOr<std::unique_ptr<prometheus::Exposer>> StartMetricsServer(
    const std::string& address,
    std::shared_ptr<prometheus::Collectable> collectable) {
  std::unique_ptr<prometheus::Exposer> exposer;
  // prometheus-cpp (civetweb) reports a failed bind by throwing; this is
  // the one place its exceptions are turned into a Status.
  try {
    exposer = std::make_unique<prometheus::Exposer>(address);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(
        "cannot serve metrics on '", address, "': ", e.what(),
        " (expected a free host:port; an empty --metrics_listen turns "
        "metrics off)"));
  }
  exposer->RegisterCollectable(std::move(collectable));
  return exposer;
}

}  // namespace gradcomp::service
