// A ReduceRequest with parts (a bucket of tensors in one shared-memory
// slice, gradcomp.proto) split into the one request per tensor that the
// rest of the daemon serves, so that a part fails or succeeds like a tensor
// sent alone:
//
//   GC_ASSIGN_OR_RETURN(std::vector<v1::ReduceRequest> each,
//                       SplitParts(request));
//   // each[i]: part i's tensor, shape and slices, request_id i, and the
//   // request's job, step, dtype, codec, batch, mode and gossip.
#ifndef GRADCOMP_SERVICE_API_REQUEST_PARTS_H_
#define GRADCOMP_SERVICE_API_REQUEST_PARTS_H_

#include <cstddef>
#include <vector>

#include "absl/status/statusor.h"
#include "gradcomp/v1/gradcomp.pb.h"

namespace gradcomp::service {

// Each part takes a slot of the stream's queue and, in a batch, a thread
// while it waits for the others: as many as a batch may hold members.
inline constexpr size_t kMaxRequestParts = 128;

// The parts of `request` (which has at least one) as requests of their own.
// InvalidArgument when the request also sets tensor, shape or data, lacks
// input_shm or output_shm, has more than kMaxRequestParts parts, or when a
// part has no tensor name, repeats one, has a negative dimension or does not
// lie within both slices (the message names the part). The slices are
// checked against their regions later, per part, as any request's are.
absl::StatusOr<std::vector<v1::ReduceRequest>> SplitParts(
    const v1::ReduceRequest& request);

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_API_REQUEST_PARTS_H_
