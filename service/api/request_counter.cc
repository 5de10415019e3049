#include "service/api/request_counter.h"

#include <string>

#include "absl/status/status.h"
#include "google/protobuf/descriptor.h"
#include "gradcomp/v1/gradcomp.pb.h"

namespace gradcomp::service {
namespace {

using grpc::experimental::InterceptionHookPoints;

constexpr absl::string_view kGradcompService = "gradcomp.v1.Gradcomp";

// The services gRPC adds to the daemon's server, whose protos are not in
// this binary's descriptor pool.
struct KnownMethod {
  absl::string_view service;
  absl::string_view method;
};
constexpr KnownMethod kBuiltinMethods[] = {
    {"grpc.health.v1.Health", "Check"},
    {"grpc.health.v1.Health", "Watch"},
    {"grpc.reflection.v1alpha.ServerReflection", "ServerReflectionInfo"},
};

// The method's descriptor, whose name() lives as long as the program;
// null if gradcomp.v1.Gradcomp has no such method.
const google::protobuf::MethodDescriptor* GradcompMethod(
    absl::string_view method) {
  // Linking gradcomp.pb.cc put the service in the generated pool.
  const google::protobuf::ServiceDescriptor* service =
      gradcomp::v1::ReduceRequest::descriptor()->file()->FindServiceByName(
          "Gradcomp");
  return service == nullptr ? nullptr
                            : service->FindMethodByName(std::string(method));
}

class RequestCounter : public grpc::experimental::Interceptor {
 public:
  RequestCounter(Metrics* metrics, absl::string_view full_method)
      : metrics_(metrics), labels_(RequestLabels(full_method)) {}

  void Intercept(
      grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            InterceptionHookPoints::PRE_SEND_STATUS)) {
      // gRPC's and Abseil's status codes share their numbering.
      metrics_->CountRequest(
          labels_.first, labels_.second,
          static_cast<absl::StatusCode>(methods->GetSendStatus().error_code()));
    }
    methods->Proceed();
  }

 private:
  Metrics* const metrics_;
  const std::pair<absl::string_view, absl::string_view> labels_;
};

class RequestCounterFactory
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit RequestCounterFactory(Metrics* metrics) : metrics_(metrics) {}

  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new RequestCounter(metrics_, info->method());
  }

 private:
  Metrics* const metrics_;
};

}  // namespace

std::pair<absl::string_view, absl::string_view> RequestLabels(
    absl::string_view full_method) {
  absl::string_view name = full_method;
  if (!name.empty() && name.front() == '/') name.remove_prefix(1);
  const size_t slash = name.find('/');
  if (slash != absl::string_view::npos) {
    const absl::string_view service = name.substr(0, slash);
    const absl::string_view method = name.substr(slash + 1);
    // The labels returned point into static strings, so that they outlive
    // the call's method name.
    for (const KnownMethod& known : kBuiltinMethods) {
      if (service == known.service && method == known.method) {
        return {known.service, known.method};
      }
    }
    if (service == kGradcompService) {
      if (const auto* descriptor = GradcompMethod(method)) {
        return {kGradcompService, descriptor->name()};
      }
    }
  }
  return {"other", "other"};
}

std::vector<
    std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
RequestCounterInterceptors(Metrics* metrics) {
  std::vector<
      std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
      creators;
  creators.push_back(std::make_unique<RequestCounterFactory>(metrics));
  return creators;
}

}  // namespace gradcomp::service
