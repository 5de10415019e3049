#include "service/api/gradcomp_service.h"

#include <string>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "base/status_macros.h"
#include "codecs/wire.h"
#include "service/api/convert.h"
#include "service/api/grpc_status.h"
#include "service/config/policy_proto.h"
#include "service/version.h"

namespace gradcomp::service {

GradcompService::GradcompService(Engine* engine, Metrics* metrics,
                                 int stream_workers)
    : engine_(engine), metrics_(metrics), stream_pool_(stream_workers) {}

absl::StatusOr<v1::ReduceResponse> GradcompService::DoReduce(
    const v1::ReduceRequest& request) {
  absl::StatusOr<ReduceInput> input = ReduceInputFromProto(request);
  if (!input.ok()) {
    // Refused before the engine saw it; counted here so that every request
    // shows in gradcomp_reduce_total.
    metrics_->CountReduce("unresolved", input.status().code());
    return input.status();
  }
  GC_ASSIGN_OR_RETURN(ReduceOutput output, engine_->Reduce(*input));
  return ReduceResponseToProto(request, std::move(output));
}

grpc::Status GradcompService::Reduce(grpc::ServerContext* /*context*/,
                                     const v1::ReduceRequest* request,
                                     v1::ReduceResponse* response) {
  absl::StatusOr<v1::ReduceResponse> result = DoReduce(*request);
  if (!result.ok()) return ToGrpcStatus(result.status());
  *response = std::move(*result);
  return grpc::Status::OK;
}

grpc::Status GradcompService::ReduceStream(
    grpc::ServerContext* /*context*/,
    grpc::ServerReaderWriter<v1::ReduceStreamResponse, v1::ReduceRequest>*
        stream) {
  // gRPC allows one Read and one Write at a time on a stream: this thread
  // reads, and the workers write one at a time under `mu`.
  absl::Mutex mu;
  int pending = 0;
  bool write_failed = false;
  v1::ReduceRequest request;
  while (stream->Read(&request)) {
    {
      absl::MutexLock lock(&mu);
      ++pending;
    }
    stream_pool_.Schedule([this, stream, &mu, &pending, &write_failed,
                           request = std::move(request)] {
      v1::ReduceStreamResponse response;
      absl::StatusOr<v1::ReduceResponse> result = DoReduce(request);
      if (result.ok()) {
        *response.mutable_result() = std::move(*result);
      } else {
        response.set_error_code(static_cast<int>(result.status().code()));
        response.set_error_message(std::string(result.status().message()));
        response.set_tensor(request.tensor());
        response.set_request_id(request.request_id());
      }
      absl::MutexLock lock(&mu);
      if (!write_failed && !stream->Write(response)) write_failed = true;
      --pending;
    });
    request = v1::ReduceRequest();
  }
  absl::MutexLock lock(&mu);
  mu.Await(absl::Condition(
      +[](int* n) { return *n == 0; }, &pending));
  if (write_failed) {
    return grpc::Status(grpc::StatusCode::CANCELLED,
                        "the client stopped reading results");
  }
  return grpc::Status::OK;
}

grpc::Status GradcompService::GetInfo(grpc::ServerContext* /*context*/,
                                      const v1::GetInfoRequest* /*request*/,
                                      v1::GetInfoResponse* response) {
  response->set_version(kVersion);
  response->set_wire_format_version(codecs::kWireVersion);
  for (const codecs::CodecInfo& info : engine_->registry().List()) {
    v1::CodecDescription* codec = response->add_codecs();
    codec->set_name(info.name);
    codec->set_wire_id(static_cast<uint32_t>(info.id));
    codec->set_family(info.family);
    codec->set_summable(info.summable);
    codec->set_unbiased(info.unbiased);
    codec->set_stateful(info.stateful);
    codec->set_rounds(static_cast<uint32_t>(info.rounds));
    for (const std::string& param : info.params) codec->add_params(param);
  }
  response->set_world_size(static_cast<uint32_t>(engine_->world_size()));
  response->set_rank(static_cast<uint32_t>(engine_->rank()));
  response->set_device("cpu");
  response->add_transports("local");
  response->set_policy_hash(engine_->policy()->hash);
  return grpc::Status::OK;
}

grpc::Status GradcompService::GetPolicy(grpc::ServerContext* /*context*/,
                                        const v1::GetPolicyRequest* /*request*/,
                                        v1::GetPolicyResponse* response) {
  std::shared_ptr<const Engine::PolicySnapshot> snapshot = engine_->policy();
  *response->mutable_policy() = PolicyToProto(snapshot->policy);
  response->set_hash(snapshot->hash);
  return grpc::Status::OK;
}

grpc::Status GradcompService::SetPolicy(grpc::ServerContext* /*context*/,
                                        const v1::SetPolicyRequest* request,
                                        v1::SetPolicyResponse* response) {
  absl::StatusOr<std::string> hash =
      engine_->SetPolicy(PolicyFromProto(request->policy()));
  if (!hash.ok()) return ToGrpcStatus(hash.status());
  response->set_hash(*hash);
  return grpc::Status::OK;
}

grpc::Status GradcompService::RegisterSystemSharedMemory(
    grpc::ServerContext* /*context*/,
    const v1::RegisterSystemSharedMemoryRequest* /*request*/,
    v1::RegisterSystemSharedMemoryResponse* /*response*/) {
  return ToGrpcStatus(absl::UnimplementedError(kSharedMemoryUnimplemented));
}

grpc::Status GradcompService::RegisterCudaSharedMemory(
    grpc::ServerContext* /*context*/,
    const v1::RegisterCudaSharedMemoryRequest* /*request*/,
    v1::RegisterCudaSharedMemoryResponse* /*response*/) {
  return ToGrpcStatus(absl::UnimplementedError(kSharedMemoryUnimplemented));
}

grpc::Status GradcompService::UnregisterSharedMemory(
    grpc::ServerContext* /*context*/,
    const v1::UnregisterSharedMemoryRequest* /*request*/,
    v1::UnregisterSharedMemoryResponse* /*response*/) {
  return ToGrpcStatus(absl::UnimplementedError(kSharedMemoryUnimplemented));
}

grpc::Status GradcompService::SharedMemoryStatus(
    grpc::ServerContext* /*context*/,
    const v1::SharedMemoryStatusRequest* /*request*/,
    v1::SharedMemoryStatusResponse* /*response*/) {
  return ToGrpcStatus(absl::UnimplementedError(kSharedMemoryUnimplemented));
}

grpc::Status GradcompService::ExportState(grpc::ServerContext* /*context*/,
                                          const v1::ExportStateRequest* request,
                                          v1::ExportStateResponse* response) {
  absl::StatusOr<std::string> blob = engine_->ExportState(request->job());
  if (!blob.ok()) return ToGrpcStatus(blob.status());
  response->set_state(std::move(*blob));
  return grpc::Status::OK;
}

grpc::Status GradcompService::ImportState(
    grpc::ServerContext* /*context*/, const v1::ImportStateRequest* request,
    v1::ImportStateResponse* /*response*/) {
  return ToGrpcStatus(engine_->ImportState(request->job(), request->state()));
}

}  // namespace gradcomp::service
