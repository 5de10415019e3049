// The client API behind ClientAuth: every gradcomp.v1.Gradcomp call is
// authorized (client_auth.h) before the wrapped service sees it, and refused
// with UNAUTHENTICATED otherwise (counted by the request counter like any
// other status). The health and reflection services stay open: kubelet
// probes send no token, and neither reveals or changes anything.
//
//   GradcompService service(...);
//   AuthenticatedService guarded(&service, ClientAuth(options));
//   StartGrpcServer(listen, &guarded, &port, &metrics);
#ifndef GRADCOMP_SERVICE_API_AUTHENTICATED_SERVICE_H_
#define GRADCOMP_SERVICE_API_AUTHENTICATED_SERVICE_H_

#include "gradcomp/v1/gradcomp.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "service/api/client_auth.h"

namespace gradcomp::service {

namespace v1 = ::gradcomp::v1;

class AuthenticatedService final : public ::gradcomp::v1::Gradcomp::Service {
 public:
  using Service = ::gradcomp::v1::Gradcomp::Service;

  // `inner` must outlive this service.
  AuthenticatedService(Service* inner, ClientAuth auth);

  grpc::Status Reduce(grpc::ServerContext* context,
                      const v1::ReduceRequest* request,
                      v1::ReduceResponse* response) override;
  grpc::Status ReduceStream(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::ReduceStreamResponse, v1::ReduceRequest>*
          stream) override;
  grpc::Status GetInfo(grpc::ServerContext* context,
                       const v1::GetInfoRequest* request,
                       v1::GetInfoResponse* response) override;
  grpc::Status GetPolicy(grpc::ServerContext* context,
                         const v1::GetPolicyRequest* request,
                         v1::GetPolicyResponse* response) override;
  grpc::Status SetPolicy(grpc::ServerContext* context,
                         const v1::SetPolicyRequest* request,
                         v1::SetPolicyResponse* response) override;
  grpc::Status RegisterSystemSharedMemory(
      grpc::ServerContext* context,
      const v1::RegisterSystemSharedMemoryRequest* request,
      v1::RegisterSystemSharedMemoryResponse* response) override;
  grpc::Status RegisterCudaSharedMemory(
      grpc::ServerContext* context,
      const v1::RegisterCudaSharedMemoryRequest* request,
      v1::RegisterCudaSharedMemoryResponse* response) override;
  grpc::Status UnregisterSharedMemory(
      grpc::ServerContext* context,
      const v1::UnregisterSharedMemoryRequest* request,
      v1::UnregisterSharedMemoryResponse* response) override;
  grpc::Status SharedMemoryStatus(
      grpc::ServerContext* context,
      const v1::SharedMemoryStatusRequest* request,
      v1::SharedMemoryStatusResponse* response) override;
  grpc::Status DeclareTensors(grpc::ServerContext* context,
                              const v1::DeclareTensorsRequest* request,
                              v1::DeclareTensorsResponse* response) override;
  grpc::Status ExportState(grpc::ServerContext* context,
                           const v1::ExportStateRequest* request,
                           v1::ExportStateResponse* response) override;
  grpc::Status ImportState(grpc::ServerContext* context,
                           const v1::ImportStateRequest* request,
                           v1::ImportStateResponse* response) override;
  grpc::Status ExportStateStream(
      grpc::ServerContext* context, const v1::ExportStateRequest* request,
      grpc::ServerWriter<v1::ExportStateResponse>* writer) override;
  grpc::Status ImportStateStream(
      grpc::ServerContext* context,
      grpc::ServerReader<v1::ImportStateRequest>* reader,
      v1::ImportStateResponse* response) override;
  grpc::Status ReleaseJob(grpc::ServerContext* context,
                          const v1::ReleaseJobRequest* request,
                          v1::ReleaseJobResponse* response) override;

 private:
  grpc::Status Check(const grpc::ServerContext& context) const;

  // A unary call: authorized, then passed on to the same method of inner_.
  template <typename Request, typename Response>
  grpc::Status Forward(grpc::Status (Service::*method)(grpc::ServerContext*,
                                                       const Request*,
                                                       Response*),
                       grpc::ServerContext* context, const Request* request,
                       Response* response) {
    if (grpc::Status denied = Check(*context); !denied.ok()) return denied;
    return (inner_->*method)(context, request, response);
  }

  Service* const inner_;
  const ClientAuth auth_;
};

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_API_AUTHENTICATED_SERVICE_H_
