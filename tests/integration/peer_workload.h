// The multi-daemon test workload, shared by the worker processes that submit
// it and the test that checks the results: tensor shapes, each rank's
// gradients, and the codec run of every rank replayed in one process.
//
//   std::vector<float> g = WorkloadGradient(rank, tensor, step);
//   GC_ASSIGN_OR_RETURN(auto average, Replay(codec, grads_by_rank, ...));
//   GC_ASSIGN_OR_RETURN(auto sharded, ReplaySharded(codec, ..., group));
#ifndef GRADCOMP_TESTS_INTEGRATION_PEER_WORKLOAD_H_
#define GRADCOMP_TESTS_INTEGRATION_PEER_WORKLOAD_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "codecs/codec.h"
#include "codecs/state.h"
#include "service/collective/in_process_group.h"

namespace gradcomp::testing {

std::string WorkloadTensorName(int tensor);
std::vector<int64_t> WorkloadShape(int tensor);
// Heavy-tailed values of scale ~1e-2, different for every rank, tensor and
// step.
std::vector<float> WorkloadGradient(int rank, int tensor, int64_t step);

// Replays one tensor-step of `codec` for every rank in this process, as W
// daemons would run it: each rank encodes with its own state (stores[r]),
// the payloads are gathered (or summed in rank order), and every rank's
// decoded average is returned. The engine's StepContext is mirrored, so the
// results are the daemons' bit for bit.
absl::StatusOr<std::vector<std::vector<float>>> Replay(
    const codecs::Codec& codec, const std::vector<std::vector<float>>& grads,
    const std::vector<int64_t>& shape, const std::string& job,
    const std::string& tensor, int64_t step, uint64_t seed,
    std::vector<codecs::StateStore>& stores);

// The same for sharded aggregation (service/collective/sharded_reduce.h):
// W threads run ShardedReduce over `group` (world size grads.size()), each
// rank with its own state (stores[r]: the worker's and the owner's), so the
// results are the daemons' bit for bit. InvalidArgument when the codec
// cannot be sharded.
absl::StatusOr<std::vector<std::vector<float>>> ReplaySharded(
    const codecs::Codec& codec, const std::vector<std::vector<float>>& grads,
    const std::vector<int64_t>& shape, const std::string& job,
    const std::string& tensor, int64_t step, uint64_t seed,
    std::vector<codecs::StateStore>& stores, service::InProcessGroup& group);

}  // namespace gradcomp::testing

#endif  // GRADCOMP_TESTS_INTEGRATION_PEER_WORKLOAD_H_
