#include "service/api/authenticated_service.h"

#include <optional>
#include <utility>

#include "service/api/grpc_status.h"

namespace gradcomp::service {

AuthenticatedService::AuthenticatedService(Service* inner, ClientAuth auth)
    : inner_(inner), auth_(std::move(auth)) {}

grpc::Status AuthenticatedService::Check(
    const grpc::ServerContext& context) const {
  std::optional<absl::string_view> authorization;
  const auto& metadata = context.client_metadata();
  if (auto it = metadata.find(kAuthorizationKey); it != metadata.end()) {
    authorization.emplace(it->second.data(), it->second.size());
  }
  return ToGrpcStatus(auth_.Authorize(context.peer(), authorization));
}

grpc::Status AuthenticatedService::Reduce(grpc::ServerContext* context,
                                          const v1::ReduceRequest* request,
                                          v1::ReduceResponse* response) {
  return Forward(&Service::Reduce, context, request, response);
}

grpc::Status AuthenticatedService::ReduceStream(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<v1::ReduceStreamResponse, v1::ReduceRequest>*
        stream) {
  if (grpc::Status denied = Check(*context); !denied.ok()) return denied;
  return inner_->ReduceStream(context, stream);
}

grpc::Status AuthenticatedService::ExportStateStream(
    grpc::ServerContext* context, const v1::ExportStateRequest* request,
    grpc::ServerWriter<v1::ExportStateResponse>* writer) {
  if (grpc::Status denied = Check(*context); !denied.ok()) return denied;
  return inner_->ExportStateStream(context, request, writer);
}

grpc::Status AuthenticatedService::ImportStateStream(
    grpc::ServerContext* context,
    grpc::ServerReader<v1::ImportStateRequest>* reader,
    v1::ImportStateResponse* response) {
  if (grpc::Status denied = Check(*context); !denied.ok()) return denied;
  return inner_->ImportStateStream(context, reader, response);
}

grpc::Status AuthenticatedService::GetInfo(grpc::ServerContext* context,
                                           const v1::GetInfoRequest* request,
                                           v1::GetInfoResponse* response) {
  return Forward(&Service::GetInfo, context, request, response);
}

grpc::Status AuthenticatedService::GetPolicy(
    grpc::ServerContext* context, const v1::GetPolicyRequest* request,
    v1::GetPolicyResponse* response) {
  return Forward(&Service::GetPolicy, context, request, response);
}

grpc::Status AuthenticatedService::SetPolicy(
    grpc::ServerContext* context, const v1::SetPolicyRequest* request,
    v1::SetPolicyResponse* response) {
  return Forward(&Service::SetPolicy, context, request, response);
}

grpc::Status AuthenticatedService::RegisterSystemSharedMemory(
    grpc::ServerContext* context,
    const v1::RegisterSystemSharedMemoryRequest* request,
    v1::RegisterSystemSharedMemoryResponse* response) {
  return Forward(&Service::RegisterSystemSharedMemory, context, request,
                 response);
}

grpc::Status AuthenticatedService::RegisterCudaSharedMemory(
    grpc::ServerContext* context,
    const v1::RegisterCudaSharedMemoryRequest* request,
    v1::RegisterCudaSharedMemoryResponse* response) {
  return Forward(&Service::RegisterCudaSharedMemory, context, request,
                 response);
}

grpc::Status AuthenticatedService::UnregisterSharedMemory(
    grpc::ServerContext* context,
    const v1::UnregisterSharedMemoryRequest* request,
    v1::UnregisterSharedMemoryResponse* response) {
  return Forward(&Service::UnregisterSharedMemory, context, request, response);
}

grpc::Status AuthenticatedService::SharedMemoryStatus(
    grpc::ServerContext* context, const v1::SharedMemoryStatusRequest* request,
    v1::SharedMemoryStatusResponse* response) {
  return Forward(&Service::SharedMemoryStatus, context, request, response);
}

grpc::Status AuthenticatedService::DeclareTensors(
    grpc::ServerContext* context, const v1::DeclareTensorsRequest* request,
    v1::DeclareTensorsResponse* response) {
  return Forward(&Service::DeclareTensors, context, request, response);
}

grpc::Status AuthenticatedService::ExportState(
    grpc::ServerContext* context, const v1::ExportStateRequest* request,
    v1::ExportStateResponse* response) {
  return Forward(&Service::ExportState, context, request, response);
}

grpc::Status AuthenticatedService::ImportState(
    grpc::ServerContext* context, const v1::ImportStateRequest* request,
    v1::ImportStateResponse* response) {
  return Forward(&Service::ImportState, context, request, response);
}

grpc::Status AuthenticatedService::ReleaseJob(
    grpc::ServerContext* context, const v1::ReleaseJobRequest* request,
    v1::ReleaseJobResponse* response) {
  return Forward(&Service::ReleaseJob, context, request, response);
}

}  // namespace gradcomp::service
