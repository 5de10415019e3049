#include "tests/integration/peer_workload.h"

#include <memory>
#include <optional>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "codecs/random.h"
#include "codecs/wire.h"
#include "service/collective/sharded_reduce.h"

namespace gradcomp::testing {

std::string WorkloadTensorName(int tensor) {
  return absl::StrCat("layer", tensor, ".weight");
}

std::vector<int64_t> WorkloadShape(int tensor) {
  return {16, 16 + 37 * tensor};
}

std::vector<float> WorkloadGradient(int rank, int tensor, int64_t step) {
  const std::vector<int64_t> shape = WorkloadShape(tensor);
  std::mt19937 rng(
      static_cast<uint32_t>(rank * 1000003 + tensor * 7919 + step));
  std::student_t_distribution<float> t(3.0f);
  std::vector<float> values(shape[0] * shape[1]);
  for (float& v : values) v = 1e-2f * t(rng);
  return values;
}

absl::StatusOr<std::vector<std::vector<float>>> Replay(
    const codecs::Codec& codec, const std::vector<std::vector<float>>& grads,
    const std::vector<int64_t>& shape, const std::string& job,
    const std::string& tensor, int64_t step, uint64_t seed,
    std::vector<codecs::StateStore>& stores) {
  const int w = static_cast<int>(grads.size());
  std::vector<codecs::StateStore::Locked> states;
  std::vector<std::unique_ptr<codecs::CodecSession>> sessions;
  for (int r = 0; r < w; ++r) {
    // dtype code 1: DType::kFloat32, as the engine passes it.
    states.push_back(stores[r].Acquire(job, tensor, shape, 1));
    codecs::StepContext ctx;
    ctx.seed = seed;
    ctx.tensor_id = codecs::TensorId(tensor);
    ctx.step = step;
    ctx.rank = r;
    ctx.world_size = w;
    GC_ASSIGN_OR_RETURN(
        std::unique_ptr<codecs::CodecSession> session,
        codec.Start(codecs::TensorView{grads[r], shape}, *states[r], ctx));
    sessions.push_back(std::move(session));
  }
  while (true) {
    std::vector<std::optional<codecs::Round>> rounds;
    for (int r = 0; r < w; ++r) {
      GC_ASSIGN_OR_RETURN(std::optional<codecs::Round> round,
                          sessions[r]->NextRound());
      rounds.push_back(std::move(round));
    }
    if (!rounds[0].has_value()) break;
    codecs::RoundResult result;
    result.world_size = w;
    for (int r = 0; r < w; ++r) {
      if (rounds[r]->collective == codecs::Collective::kGather) {
        result.payloads.push_back(rounds[r]->payload);
        continue;
      }
      GC_ASSIGN_OR_RETURN(codecs::ParsedPayload parsed,
                          codecs::PeekPayload(rounds[r]->payload));
      const size_t n = parsed.body.size() /
                       codecs::ElemTypeBytes(
                           static_cast<codecs::ElemType>(parsed.params[0]));
      if (r == 0) result.sum.assign(n, 0.0f);
      GC_RETURN_IF_ERROR(
          codecs::AddDenseBody(parsed, 1.0f, absl::MakeSpan(result.sum)));
    }
    for (int r = 0; r < w; ++r) {
      GC_RETURN_IF_ERROR(sessions[r]->Absorb(result));
    }
  }
  std::vector<std::vector<float>> out(w, std::vector<float>(grads[0].size()));
  for (int r = 0; r < w; ++r) {
    GC_RETURN_IF_ERROR(sessions[r]->Finish(absl::MakeSpan(out[r])));
  }
  return out;
}

absl::StatusOr<std::vector<std::vector<float>>> ReplaySharded(
    const codecs::Codec& codec, const std::vector<std::vector<float>>& grads,
    const std::vector<int64_t>& shape, const std::string& job,
    const std::string& tensor, int64_t step, uint64_t seed,
    std::vector<codecs::StateStore>& stores, service::InProcessGroup& group) {
  const int w = static_cast<int>(grads.size());
  const size_t n = grads[0].size();
  const codecs::SingleRoundCodec* shardable =
      service::ShardableCodec(service::Aggregation::kSharded, codec, w, n);
  if (shardable == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("codec '", codec.info().name, "' cannot be sharded over ",
                     w, " ranks for ", n, " elements"));
  }
  std::vector<std::vector<float>> out(w, std::vector<float>(n));
  std::vector<absl::Status> status(w);
  std::vector<std::thread> threads;
  for (int r = 0; r < w; ++r) {
    threads.emplace_back([&, r] {
      // dtype code 1: DType::kFloat32, as the engine passes it.
      codecs::StateStore::Locked state =
          stores[r].Acquire(job, tensor, shape, 1);
      codecs::StepContext ctx;
      ctx.seed = seed;
      ctx.tensor_id = codecs::TensorId(tensor);
      ctx.step = step;
      ctx.rank = r;
      ctx.world_size = w;
      status[r] =
          service::ShardedReduce(group.collective(r), stores[r], *shardable,
                                 {job, tensor, step, 0}, grads[r], ctx,
                                 absl::MakeSpan(out[r]), nullptr)
              .status();
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int r = 0; r < w; ++r) {
    if (!status[r].ok()) return status[r];
  }
  return out;
}

}  // namespace gradcomp::testing
