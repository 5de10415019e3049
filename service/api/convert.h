// proto <-> core conversions of the Reduce API, so the gRPC service only
// moves data between the wire and the engine.
//
//   GC_ASSIGN_OR_RETURN(ReduceInput input, ReduceInputFromProto(request));
//   GC_ASSIGN_OR_RETURN(ReduceOutput output, engine.Reduce(input));
//   *response = ReduceResponseToProto(request, std::move(output));
#ifndef GRADCOMP_SERVICE_API_CONVERT_H_
#define GRADCOMP_SERVICE_API_CONVERT_H_

#include <memory>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "gradcomp/v1/gradcomp.pb.h"
#include "service/collective/batching_collective.h"
#include "service/engine/engine.h"

namespace gradcomp::service {

namespace v1 = ::gradcomp::v1;

// The shared-memory slices a request names (input_shm, output_shm), mapped
// by the caller, who holds them for the whole call.
struct MappedSlices {
  absl::Span<char> input;   // used when the request has input_shm
  absl::Span<char> output;  // used when the request has output_shm
};

// The input views `request.data()`, or `slices.input` for a request with
// input_shm; either must outlive it. With output_shm the engine writes the
// average into `slices.output`. Overlapping input and output slices are
// InvalidArgument: the engine reads fp32 input in place and still reads it
// after it has written the output.
//
// The input's batch is made from the request's (InvalidArgument when
// MakeBatchSpec refuses it), or is `batch` when the request is a part of a
// request with parts, whose batch SplitParts made once for all of them.
absl::StatusOr<ReduceInput> ReduceInputFromProto(
    const v1::ReduceRequest& request, const MappedSlices& slices = {},
    std::shared_ptr<const BatchSpec> batch = nullptr);

// The engine's form of a request's gossip spec (zeros: the defaults).
GossipSpec GossipSpecFromProto(const v1::GossipSpec& spec);

// MakeBatchSpec of a request's batch, to be shared by its parts.
absl::StatusOr<std::shared_ptr<const BatchSpec>> BatchSpecFromProto(
    const v1::ReduceBatch& batch);

v1::ReduceResponse ReduceResponseToProto(const v1::ReduceRequest& request,
                                         ReduceOutput output);

// The message of shared-memory requests to a daemon started without
// --allow_client_shm.
inline constexpr char kClientShmOff[] =
    "client shared memory is off on this daemon: start gradcompd with "
    "--allow_client_shm (and share /dev/shm with it), or send tensors inline "
    "(ReduceRequest.data)";

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_API_CONVERT_H_
