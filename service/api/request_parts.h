// A ReduceRequest with parts (a bucket of tensors in one shared-memory
// slice, gradcomp.proto) split into the one request per tensor that the
// rest of the daemon serves, so that a part fails or succeeds like a tensor
// sent alone:
//
//   GC_ASSIGN_OR_RETURN(SplitRequest split, SplitParts(request));
//   // split.parts[i]: part i's tensor, shape and slices, request_id i, and
//   // the request's job, step, dtype, codec, mode and gossip; split.batch:
//   // the request's batch, made once for every part.
#ifndef GRADCOMP_SERVICE_API_REQUEST_PARTS_H_
#define GRADCOMP_SERVICE_API_REQUEST_PARTS_H_

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "gradcomp/v1/gradcomp.pb.h"
#include "service/collective/batching_collective.h"

namespace gradcomp::service {

// Each part takes a slot of the stream's queue and, in a batch, a thread
// while it waits for the others: as many as a batch may hold members.
inline constexpr size_t kMaxRequestParts = 128;

struct SplitRequest {
  std::vector<v1::ReduceRequest> parts;  // without the batch
  // The request's batch for every part (ReduceInputFromProto's `batch`):
  // one copy of its member list, not one per part; null when it has none.
  std::shared_ptr<const BatchSpec> batch;
};

// The parts of `request` (which has at least one) as requests of their own.
// InvalidArgument when the request also sets tensor, shape or data, lacks
// input_shm or output_shm, has more than kMaxRequestParts parts or a batch
// that MakeBatchSpec refuses, or when a part has no tensor name, repeats
// one, has a negative dimension or does not lie within both slices (the
// message names the part). The slices are checked against their regions
// later, per part, as any request's are, and each part against the batch's
// members.
absl::StatusOr<SplitRequest> SplitParts(const v1::ReduceRequest& request);

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_API_REQUEST_PARTS_H_
