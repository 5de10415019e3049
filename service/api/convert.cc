#include "service/api/convert.h"

#include <cstdint>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "service/config/policy_proto.h"

namespace gradcomp::service {

absl::StatusOr<std::shared_ptr<const BatchSpec>> BatchSpecFromProto(
    const v1::ReduceBatch& batch) {
  GC_ASSIGN_OR_RETURN(BatchSpec spec,
                      MakeBatchSpec(batch.id(), {batch.members().begin(),
                                                 batch.members().end()}));
  return std::make_shared<const BatchSpec>(std::move(spec));
}

GossipSpec GossipSpecFromProto(const v1::GossipSpec& spec) {
  return GossipSpec{spec.topology(),
                    spec.rank(),
                    spec.power_steps(),
                    spec.diffusion(),
                    spec.choco_topk_fraction(),
                    spec.fresh_factors()};
}

absl::StatusOr<ReduceInput> ReduceInputFromProto(
    const v1::ReduceRequest& request, const MappedSlices& slices,
    std::shared_ptr<const BatchSpec> batch) {
  if (request.has_output_shm() && request.output_shm().byte_size() == 0) {
    // An empty output span means "answer inline" to the engine.
    return absl::InvalidArgumentError(
        "output_shm.byte_size is 0, expected numel x dtype bytes (send "
        "zero-element tensors inline)");
  }
  if (request.has_input_shm() && request.has_output_shm()) {
    // The engine reads fp32 input in place and still reads it (relative
    // error, codec state) after it has written the output.
    const auto in = reinterpret_cast<uintptr_t>(slices.input.data());
    const auto out = reinterpret_cast<uintptr_t>(slices.output.data());
    if (in < out + slices.output.size() && out < in + slices.input.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "input_shm (region '", request.input_shm().region(), "' offset ",
          request.input_shm().offset(), ", ", slices.input.size(),
          " bytes) and output_shm (region '", request.output_shm().region(),
          "' offset ", request.output_shm().offset(), ", ",
          slices.output.size(), " bytes) overlap; expected disjoint slices"));
    }
  }
  ReduceInput input;
  input.job = request.job();
  input.tensor = request.tensor();
  input.step = request.step();
  input.dtype = DTypeFromProto(request.dtype());
  input.shape.assign(request.shape().begin(), request.shape().end());
  if (request.has_input_shm()) {
    input.data = absl::string_view(slices.input.data(), slices.input.size());
  } else {
    input.data = request.data();
  }
  if (request.has_output_shm()) input.output = slices.output;
  if (request.has_codec()) input.codec = CodecSpecFromProto(request.codec());
  if (request.has_batch()) {
    GC_ASSIGN_OR_RETURN(input.batch, BatchSpecFromProto(request.batch()));
  } else {
    input.batch = std::move(batch);
  }
  switch (request.mode()) {
    case v1::REDUCE_MODE_AVERAGE:
      break;
    case v1::REDUCE_MODE_GOSSIP:
      input.mode = ReduceMode::kGossip;
      input.gossip = GossipSpecFromProto(request.gossip());
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "mode is ", request.mode(),
          ", expected REDUCE_MODE_AVERAGE (0) or REDUCE_MODE_GOSSIP (1)"));
  }
  input.consensus_distance = request.consensus_distance();
  return input;
}

v1::ReduceResponse ReduceResponseToProto(const v1::ReduceRequest& request,
                                         ReduceOutput output) {
  v1::ReduceResponse response;
  response.set_tensor(request.tensor());
  response.set_step(request.step());
  response.set_request_id(request.request_id());
  response.set_dtype(request.dtype());
  response.set_data(std::move(output.data));
  const ReduceStats& s = output.stats;
  v1::ReduceStats* stats = response.mutable_stats();
  stats->set_codec(s.codec);
  stats->set_raw_bytes(s.raw_bytes);
  stats->set_wire_bytes(s.wire_bytes);
  stats->set_relative_error(s.relative_error);
  stats->set_world_size(static_cast<uint32_t>(s.world_size));
  stats->set_dense_reason(s.dense_reason);
  stats->set_nonfinite_values(s.nonfinite_values);
  v1::StageTimings* t = stats->mutable_timings();
  t->set_encode_seconds(s.encode_seconds);
  t->set_collective_seconds(s.collective_seconds);
  t->set_decode_seconds(s.decode_seconds);
  t->set_total_seconds(s.total_seconds);
  return response;
}

}  // namespace gradcomp::service
