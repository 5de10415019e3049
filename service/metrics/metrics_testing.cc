#include "service/metrics/metrics_testing.h"

#include <vector>

#include "prometheus/metric_family.h"

namespace gradcomp::service {

double MetricValue(const prometheus::Collectable& collectable,
                   absl::string_view name,
                   const std::map<std::string, std::string>& labels) {
  for (const prometheus::MetricFamily& family : collectable.Collect()) {
    if (family.name != name) continue;
    for (const prometheus::ClientMetric& metric : family.metric) {
      std::map<std::string, std::string> have;
      for (const auto& label : metric.label) have[label.name] = label.value;
      if (have != labels) continue;
      switch (family.type) {
        case prometheus::MetricType::Counter:
          return metric.counter.value;
        case prometheus::MetricType::Gauge:
          return metric.gauge.value;
        case prometheus::MetricType::Histogram:
          return static_cast<double>(metric.histogram.sample_count);
        default:
          return metric.untyped.value;
      }
    }
  }
  return 0;
}

}  // namespace gradcomp::service
