// Reads one sample back from a prometheus::Collectable, for tests that check
// what a request did to the metrics (no mocks: the real registry is read).
//
//   EXPECT_EQ(MetricValue(*metrics.collectable(), "gradcomp_reduce_total",
//                         {{"codec", "none"}, {"code", "OK"}}), 1);
#ifndef GRADCOMP_SERVICE_METRICS_METRICS_TESTING_H_
#define GRADCOMP_SERVICE_METRICS_METRICS_TESTING_H_

#include <map>
#include <string>

#include "absl/strings/string_view.h"
#include "prometheus/collectable.h"

namespace gradcomp::service {

// The value of the series `name` whose labels are exactly `labels`: a
// counter's or gauge's value, a histogram's sample count; 0 when the series
// does not exist (Prometheus reads a missing counter as zero, too).
double MetricValue(const prometheus::Collectable& collectable,
                   absl::string_view name,
                   const std::map<std::string, std::string>& labels = {});

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_METRICS_METRICS_TESTING_H_
