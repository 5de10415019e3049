// proto <-> core conversions of the Reduce API, so the gRPC service only
// moves data between the wire and the engine.
//
//   GC_ASSIGN_OR_RETURN(ReduceInput input, ReduceInputFromProto(request));
//   GC_ASSIGN_OR_RETURN(ReduceOutput output, engine.Reduce(input));
//   *response = ReduceResponseToProto(request, std::move(output));
#ifndef GRADCOMP_SERVICE_API_CONVERT_H_
#define GRADCOMP_SERVICE_API_CONVERT_H_

#include "absl/status/statusor.h"
#include "gradcomp/v1/gradcomp.pb.h"
#include "service/engine/engine.h"

namespace gradcomp::service {

namespace v1 = ::gradcomp::v1;

// The input views `request.data()`: the request must outlive it. Requests
// with shared-memory input or output are Unimplemented for now.
absl::StatusOr<ReduceInput> ReduceInputFromProto(
    const v1::ReduceRequest& request);

v1::ReduceResponse ReduceResponseToProto(const v1::ReduceRequest& request,
                                         ReduceOutput output);

// The message of every shared-memory RPC until regions are implemented.
inline constexpr char kSharedMemoryUnimplemented[] =
    "shared memory arrives in a later gradcomp release; send tensors inline "
    "(ReduceRequest.data) for now";

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_API_CONVERT_H_
