#include "service/engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <optional>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/seconds_since.h"
#include "base/status_macros.h"
#include "codecs/error_feedback.h"
#include "codecs/nonfinite.h"
#include "codecs/random.h"
#include "codecs/tensor.h"
#include "service/collective/sharded_reduce.h"
#include "service/engine/square_sums.h"

namespace gradcomp::service {
namespace {

using Clock = std::chrono::steady_clock;

std::string ShapeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

// Element count of `shape`, checked: dims >= 0 and numel * width within
// `max_bytes`, tested before each multiplication so nothing can overflow.
absl::StatusOr<uint64_t> CheckedNumel(absl::Span<const int64_t> shape,
                                      size_t width, uint64_t max_bytes) {
  const uint64_t max_numel = max_bytes / width;
  uint64_t numel = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", ShapeString(shape), ": dimension ", i, " is ",
                       shape[i], ", expected >= 0"));
    }
  }
  // Before any product: [2^40, 0] holds nothing, however large 2^40 is.
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return 0;
  for (int64_t dim : shape) {
    const uint64_t d = static_cast<uint64_t>(dim);
    if (numel > max_numel / d) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "shape ", ShapeString(shape), " holds more than ", max_numel,
          " elements of ", width, " bytes, over max_tensor_bytes ", max_bytes));
    }
    numel *= d;
  }
  return numel;
}

// Dense codecs pass NaN/Inf through as an allreduce would, so that AMP's
// loss scaler sees the overflow; a compressing codec would fold them into
// its residual state and poison every later step, so it refuses them.
absl::Status NonfiniteRefused(absl::string_view what, absl::string_view codec) {
  return absl::InvalidArgumentError(absl::StrCat(
      "input holds ", what, "; codec '", codec,
      "' compresses and would keep them in its state, expected finite values "
      "(skip the step, or send it with a dense codec such as 'none')"));
}

// True when `data` can be read as floats in place: the request is fp32 and
// its bytes are 4-byte aligned (protobuf's and shared memory's buffers are).
bool IsAlignedFloat32(DType dtype, const char* data) {
  return dtype == DType::kFloat32 &&
         reinterpret_cast<uintptr_t>(data) % alignof(float) == 0;
}

// A buffer that every user overwrites in full, so no zero fill.
std::unique_ptr<float[]> UninitializedFloats(size_t n) {
  return std::unique_ptr<float[]>(new float[n]);
}

// What a codec has not sent yet: the error-feedback decorator's residual,
// DGC's accumulated velocity (topk), PowerSGD's error.
std::optional<absl::Span<float>> FindResidual(codecs::TensorState& state) {
  for (absl::string_view name :
       {codecs::kErrorFeedbackBuffer, absl::string_view("dgc.v"),
        absl::string_view("powersgd.error")}) {
    if (auto buffer = state.Find(name)) return buffer;
  }
  return std::nullopt;
}

// The fp32 values of a reduce's result: the caller's output span or the
// response's data themselves when those are aligned fp32, else scratch that
// Commit converts into them.
class ResultFloats {
 public:
  ResultFloats(const ReduceInput& in, uint64_t numel, size_t width,
               std::string* data)
      : dtype_(in.dtype), bytes_(in.output) {
    if (bytes_.empty()) {
      data->resize(numel * width);
      bytes_ = absl::MakeSpan(data->data(), data->size());
    }
    if (IsAlignedFloat32(dtype_, bytes_.data())) {
      values_ = {reinterpret_cast<float*>(bytes_.data()), numel};
    } else {
      scratch_ = UninitializedFloats(numel);
      values_ = {scratch_.get(), numel};
    }
  }
  absl::Span<float> values() const { return values_; }
  absl::Status Commit() const {
    if (scratch_ == nullptr) return absl::OkStatus();
    return EncodeFromFloatInto(dtype_, values_, bytes_);
  }

 private:
  const DType dtype_;
  absl::Span<char> bytes_;
  std::unique_ptr<float[]> scratch_;
  absl::Span<float> values_;
};

// The state store keys tensors by job + '\0' + tensor, so a job name with a
// NUL could reach into another job's state.
absl::Status CheckJobName(absl::string_view job) {
  GC_RETURN_IF_ERROR(CheckNameLength("job name", job));
  if (absl::StrContains(job, '\0')) {
    return absl::InvalidArgumentError(
        "job name holds a NUL character, expected a printable name");
  }
  return absl::OkStatus();
}

// The request's names and step, as every reduce checks them first.
absl::Status CheckNames(const ReduceInput& in) {
  GC_RETURN_IF_ERROR(CheckJobName(in.job));
  if (in.tensor.empty()) {
    return absl::InvalidArgumentError(
        "tensor name is empty, expected a name that is the same on every "
        "worker, such as 'fc1.weight'");
  }
  GC_RETURN_IF_ERROR(CheckNameLength("tensor name", in.tensor));
  if (in.step < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("step is ", in.step, ", expected >= 0"));
  }
  if (absl::StrContains(in.tensor, '#')) {
    return absl::InvalidArgumentError(
        "tensor name holds '#', which the daemon reserves for its own keys");
  }
  return absl::OkStatus();
}

std::string TensorLabel(const ReduceInput& in) {
  return absl::StrCat("tensor '", in.tensor, "' step ", in.step);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(
    const EngineOptions& options, const codecs::CodecRegistry& registry,
    codecs::StateStore* store, Collective* collective, Metrics* metrics,
    Policy policy) {
  if (!(options.error_sample_rate >= 0 && options.error_sample_rate <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("error_sample_rate is ", options.error_sample_rate,
                     ", expected a fraction in [0, 1]"));
  }
  if (options.batch_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch_timeout is ", absl::FormatDuration(options.batch_timeout),
        ", expected a positive duration"));
  }
  if (options.max_tensor_bytes == 0) {
    return absl::InvalidArgumentError(
        "max_tensor_bytes is 0, expected a positive byte count");
  }
  if (options.memory_budget_bytes == 0) {
    return absl::InvalidArgumentError(
        "memory_budget_bytes is 0, expected a positive byte count");
  }
  GC_RETURN_IF_ERROR(ValidatePolicy(policy, registry));
  return std::unique_ptr<Engine>(new Engine(
      options, registry, store, collective, metrics, std::move(policy)));
}

Engine::Engine(const EngineOptions& options,
               const codecs::CodecRegistry& registry, codecs::StateStore* store,
               Collective* collective, Metrics* metrics, Policy policy)
    : options_(options),
      registry_(registry),
      store_(store),
      collective_(collective),
      batching_(collective, options.batch_timeout),
      metrics_(metrics),
      codecs_(registry),
      budget_(options.memory_budget_bytes, metrics),
      quotas_(options.quotas, metrics),
      gossip_(collective, options.seed),
      policies_(std::move(policy)) {}

absl::StatusOr<std::string> Engine::SetPolicy(
    Policy policy, std::optional<int64_t> from_step) {
  if (from_step.has_value() && *from_step < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("from_step is ", *from_step,
                     ", expected a step >= 0 (or none, for "
                     "every step from now on)"));
  }
  GC_RETURN_IF_ERROR(ValidatePolicy(policy, registry_));
  return policies_.Set(std::move(policy), from_step);
}

absl::StatusOr<std::string> Engine::DeclareTensors(
    absl::string_view job, int64_t generation,
    absl::Span<const TensorDecl> decls) {
  GC_RETURN_IF_ERROR(CheckJobName(job));
  if (generation < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("generation is ", generation, ", expected >= 0"));
  }
  for (const TensorDecl& decl : decls) {
    if (absl::StrContains(decl.name, '#')) {
      return absl::InvalidArgumentError(absl::StrCat(
          "declared tensor name '", decl.name,
          "' holds '#', which the daemon reserves for its own keys"));
    }
  }
  GC_ASSIGN_OR_RETURN(TensorList list, TensorList::Create(decls));
  GC_ASSIGN_OR_RETURN(
      std::vector<codecs::Bytes> parts,
      collective_->Allgather(
          {std::string(job), std::string(kTensorListKey), generation, 0},
          list.Serialize()));
  std::vector<TensorList> lists;
  lists.reserve(parts.size());
  for (size_t r = 0; r < parts.size(); ++r) {
    absl::StatusOr<TensorList> theirs = TensorList::Parse(parts[r]);
    if (!theirs.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", r, "'s tensor list: ", theirs.status().message()));
    }
    lists.push_back(*std::move(theirs));
  }
  GC_RETURN_IF_ERROR(CompareTensorLists(lists));
  std::string hash = list.Hash();
  declared_.Set(job, std::move(list));
  return hash;
}

absl::StatusOr<std::string> Engine::ExportState(absl::string_view job) {
  GC_RETURN_IF_ERROR(CheckJobName(job));
  // Between steps only; the job's reduces wait until it is read.
  GC_ASSIGN_OR_RETURN(const std::optional<JobQuotas::Ticket> ticket,
                      quotas_.AdmitExport(job));
  return store_->Export(job, StateOriginOfThisRank());
}

absl::Status Engine::ImportState(absl::string_view job,
                                 absl::string_view blob) {
  GC_RETURN_IF_ERROR(CheckJobName(job));
  // Imported state counts as a reduce's would, against the job's quotas and
  // the memory budget, checked before any of it replaces what is there. The
  // admission's ticket marks the job busy until the state is written, so
  // that ReleaseJob cannot erase the job between the two.
  const std::string what =
      absl::StrCat("the state imported into job '", job, "'");
  std::optional<JobQuotas::Ticket> ticket;
  return store_->Import(
      job, blob,
      [&](std::vector<codecs::StateStore::ImportedSize>& entries) {
        // Per tensor, as a reduce records it: a sharded tensor's slice
        // entries count as its own (or, after its next reduce, twice).
        // Those of another world size (a checkpoint of a larger job) are
        // left out: this daemon would neither use nor count them.
        std::vector<codecs::StateStore::ImportedSize> sizes;
        absl::flat_hash_map<absl::string_view, size_t> index;
        absl::flat_hash_set<absl::string_view> imported;
        for (auto& [name, bytes, skip] : entries) {
          skip = !UsedAtWorldSize(name, collective_->world_size());
          if (skip) continue;
          imported.insert(name);
          const absl::string_view owner = StateOwner(name);
          const auto [at, added] = index.try_emplace(owner, sizes.size());
          if (added) sizes.push_back({std::string(owner), 0});
          sizes[at->second].bytes += bytes;
        }
        // The entries of a tensor that the blob does not replace (its
        // slices when the blob has only its own state) stay in the store,
        // and count with it, as RecordState counts them; left out, they
        // went uncounted until the tensor's next reduce.
        for (codecs::StateStore::ImportedSize& size : sizes) {
          std::vector<std::string> kept;
          for (std::string& name :
               collective_->world_size() > 1
                   ? ShardedStateNames(size.tensor, collective_->world_size())
                   : std::vector<std::string>()) {
            if (!imported.contains(name)) kept.push_back(std::move(name));
          }
          if (!imported.contains(size.tensor)) kept.push_back(size.tensor);
          size.bytes += store_->ByteSizeOf(job, kept);
        }
        GC_ASSIGN_OR_RETURN(JobQuotas::Ticket admitted,
                            quotas_.AdmitImport(job, sizes, [&](int64_t delta) {
                              return budget_.AddStateIfRoom(delta, what);
                            }));
        ticket.emplace(std::move(admitted));
        return absl::OkStatus();
      },
      StateOriginOfThisRank());
}

absl::StatusOr<ReleasedJob> Engine::ReleaseJob(absl::string_view job) {
  GC_RETURN_IF_ERROR(CheckJobName(job));
  GC_ASSIGN_OR_RETURN(const ReleasedJob released, quotas_.Release(job, [&] {
    store_->EraseJob(job);
    gossip_.Erase(job);
  }));
  budget_.AddState(-static_cast<int64_t>(released.state_bytes));
  declared_.Erase(job);
  // The batches' records, then (forwarded) the mailbox's steps.
  batching_.ForgetJob(std::string(job));
  metrics_->CountJobReleased(job);
  return released;
}

void Engine::RecordState(const std::string& job, const std::string& tensor,
                         const codecs::TensorState& state) {
  uint64_t bytes = state.ByteSize();
  if (collective_->world_size() > 1) {
    bytes += store_->ByteSizeOf(
        job, ShardedStateNames(tensor, collective_->world_size()));
  }
  budget_.AddState(quotas_.RecordState(job, tensor, bytes));
}

bool Engine::SampleError() {
  // Deterministic: the n-th reduce (from 0) is measured when ceil(n * rate)
  // steps up, which measures exactly the configured fraction, evenly spread,
  // starting with the first reduce (a user's first call shows its error).
  const double rate = options_.error_sample_rate;
  const uint64_t n = reduces_.fetch_add(1, std::memory_order_relaxed);
  return std::ceil((n + 1) * rate) > std::ceil(n * rate);
}

absl::StatusOr<ReduceOutput> Engine::Reduce(const ReduceInput& input,
                                            const Deliver& deliver) {
  const Clock::time_point start = Clock::now();
  std::string codec_label = "unresolved";
  absl::StatusOr<ReduceOutput> out = ReduceImpl(input, &codec_label);
  if (out.ok() && deliver != nullptr) {
    if (absl::Status delivered = deliver(); !delivered.ok()) {
      out = std::move(delivered);
    }
  }
  metrics_->CountReduce(codec_label, out.status().code());
  if (!out.ok()) {
    return absl::Status(
        out.status().code(),
        absl::StrCat(TensorLabel(input), ": ", out.status().message()));
  }
  out->stats.total_seconds = SecondsSince(start);
  RecordSuccess(out->stats);
  return out;
}

void Engine::RecordSuccess(const ReduceStats& stats) {
  metrics_->AddBytes(stats.codec, stats.raw_bytes, stats.wire_bytes);
  metrics_->ObserveStage(Stage::kEncode, stats.encode_seconds);
  metrics_->ObserveStage(Stage::kCollective, stats.collective_seconds);
  metrics_->ObserveStage(Stage::kDecode, stats.decode_seconds);
  metrics_->ObserveStage(Stage::kTotal, stats.total_seconds);
  if (std::isfinite(stats.relative_error)) {
    metrics_->ObserveRelativeError(stats.codec, stats.relative_error);
  }
  if (!stats.dense_reason.empty()) metrics_->CountDense(stats.dense_reason);
  metrics_->CountBackend(stats.codec, stats.backend);
}

absl::StatusOr<std::shared_ptr<const BatchSpec>> Engine::ResolveBatch(
    const ReduceInput& in) const {
  if (in.batch == nullptr) return nullptr;
  const BatchSpec& batch = *in.batch;
  GC_RETURN_IF_ERROR(CheckBatchMember(batch, in.tensor));
  // With a declared tensor list, every member must be in it. Members may
  // have any shapes (a bucket's tensors): each member's own request checks
  // its dtype and shape against its declaration.
  for (const std::string& member : batch.members) {
    absl::Status listed = declared_.CheckListed(in.job, member);
    if (!listed.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "batch '", batch.id, "' member '", member, "': ", listed.message()));
    }
  }
  // One worker has no collective to save; its small stream pool could not
  // hold a large batch's waiting members either.
  if (collective_->world_size() == 1) return nullptr;
  return in.batch;
}

void Engine::LeaveBatch(const std::string& job, const std::string& tensor,
                        int64_t step, const BatchSpec& batch, int round,
                        std::optional<codecs::Collective> kind) {
  // One worker does not batch (ResolveBatch).
  if (collective_->world_size() == 1) return;
  batching_.Leave({job, tensor, step, round}, batch, kind);
}

absl::StatusOr<MemoryBudget::Reservation> Engine::ReserveInput(
    uint64_t bytes, absl::string_view what, absl::Time deadline) {
  const absl::Duration wait = std::clamp(
      deadline - absl::Now(), absl::ZeroDuration(), options_.memory_wait);
  return budget_.Reserve(bytes, what, wait);
}

namespace {

// An estimate of what ReduceImpl allocates for `numel` elements `width`
// bytes wide: the payload and the fp32 average always; the converted input
// (an input that is not aligned fp32), the response's data (a result not
// written to the caller's output) and the fp32 scratch of a result that is
// not aligned fp32 (ResultFloats) when it needs them; for an error sample,
// the session's copy of its payload (a dense one is tensor-sized) and the
// decode of it. Other ranks' payloads are not counted: their size is not
// known before they arrive.
uint64_t WorkingBytes(uint64_t numel, size_t width, bool input_converted,
                      bool output_inline, bool result_scratch,
                      bool sample_error) {
  const uint64_t fp32 = numel * sizeof(float);
  uint64_t bytes = 2 * fp32;
  if (input_converted) bytes += fp32;
  if (output_inline) bytes += numel * width;
  if (result_scratch) bytes += fp32;
  if (sample_error) bytes += 2 * fp32;
  return bytes;
}

}  // namespace

uint64_t Engine::WorkingBytesAhead(absl::string_view job, DType dtype,
                                   absl::Span<const int64_t> shape,
                                   uint64_t input_bytes, bool output_inline,
                                   const GossipSpec* gossip) {
  const absl::StatusOr<size_t> width = DTypeBytes(dtype);
  if (!width.ok()) return 0;
  const absl::StatusOr<uint64_t> numel =
      CheckedNumel(shape, *width, options_.max_tensor_bytes);
  if (!numel.ok() || input_bytes != *numel * *width) return 0;
  const bool fp32 = dtype == DType::kFloat32;
  const uint64_t bytes =
      WorkingBytes(*numel, *width, /*input_converted=*/!fp32, output_inline,
                   /*result_scratch=*/!fp32, /*sample_error=*/false);
  if (gossip == nullptr || *numel == 0) return bytes;
  return bytes + gossip_.WorkingBytesAhead(job, *gossip, shape);
}

absl::Status Engine::ReserveWorkingMemory(const ReduceInput& in, uint64_t numel,
                                          size_t width, bool sample_error,
                                          uint64_t extra,
                                          MemoryBudget::Reservation* own) {
  const bool result_aligned =
      in.output.empty() ? in.dtype == DType::kFloat32
                        : IsAlignedFloat32(in.dtype, in.output.data());
  const uint64_t bytes =
      WorkingBytes(numel, width, !IsAlignedFloat32(in.dtype, in.data.data()),
                   in.output.empty(), !result_aligned, sample_error) +
      extra;
  const absl::string_view what =
      extra > 0 ? "this reduce, its gossip messages and copies included,"
                : "this reduce";
  if (in.reservation != nullptr) {
    // What the caller reserved ahead counts; an estimate above the need is
    // given back.
    MemoryBudget::Reservation& held = *in.reservation;
    const uint64_t ahead = std::min(in.reserved_working_bytes, held.bytes());
    if (bytes <= ahead) {
      held.ShrinkTo(held.bytes() - (ahead - bytes));
      return absl::OkStatus();
    }
    return held.GrowTo(held.bytes() + (bytes - ahead), what,
                       options_.memory_wait);
  }
  GC_ASSIGN_OR_RETURN(*own, budget_.Reserve(in.unreserved_input_bytes + bytes,
                                            what, options_.memory_wait));
  return absl::OkStatus();
}

absl::StatusOr<ReduceOutput> Engine::ReduceImpl(const ReduceInput& in,
                                                std::string* codec_label) {
  if (in.device != nullptr) {
    DevicePlan plan = PlanDevice(in);
    if (plan.twin == nullptr) return ReduceStaged(in, codec_label);
    return ReduceOnDevice(in, std::move(plan), codec_label);
  }
  // A batched reduce leaves its batch however it ends, from the first round
  // it did not run, so that the other members go on without it; a request
  // refused below leaves it from round 0.
  int batch_round = 0;
  // The collective its batched rounds run, once its codec is chosen.
  std::optional<codecs::Collective> batch_kind;
  absl::Cleanup leave_batch = [&] {
    if (in.batch != nullptr) {
      LeaveBatch(in.job, in.tensor, in.step, *in.batch, batch_round,
                 batch_kind);
    }
  };
  GC_RETURN_IF_ERROR(CheckNames(in));
  if (in.consensus_distance != 0) {
    if (!(in.consensus_distance > 0 && std::isfinite(in.consensus_distance))) {
      return absl::InvalidArgumentError(
          absl::StrCat("consensus_distance is ", in.consensus_distance,
                       ", expected a finite value >= 0 (0: not reported)"));
    }
    metrics_->SetConsensusDistance(in.job, in.consensus_distance);
  }
  if (in.mode == ReduceMode::kGossip && in.batch != nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch '", in.batch->id,
        "' in gossip mode: gossip has no SUM rounds to batch, expected no "
        "batch"));
  }
  if (in.mode == ReduceMode::kAverage) {
    GC_RETURN_IF_ERROR(gossip_.CheckAverage(in.job));
  }
  GC_ASSIGN_OR_RETURN(const std::shared_ptr<const BatchSpec> batch,
                      ResolveBatch(in));
  GC_ASSIGN_OR_RETURN(const size_t width, DTypeBytes(in.dtype));
  GC_ASSIGN_OR_RETURN(const uint64_t numel,
                      CheckSize(in, width, in.data.size(), in.output.size()));

  ReduceOutput out;
  ReduceStats& stats = out.stats;
  stats.world_size = collective_->world_size();
  if (numel == 0) {
    // Nothing to exchange: every worker holds the same empty shape. A
    // gossip request is still held to its job's mode and spec.
    if (in.mode == ReduceMode::kGossip) {
      GC_RETURN_IF_ERROR(gossip_.Node(in.job, in.gossip).status());
    }
    *codec_label = std::string(kDenseCodec);
    stats.codec = std::string(kDenseCodec);
    stats.dense_reason = "empty";
    stats.relative_error = std::numeric_limits<double>::quiet_NaN();
    return out;
  }

  // The codec, chosen before anything below can refuse the request (the
  // same choice on every rank): a batch member refused on one rank leaves
  // its batch saying what its rounds would have been, so that every rank
  // picks the same collective for the others (BatchingCollective::Leave).
  // Sharded aggregation of a GATHER codec, when the policy asks for it and
  // the codec allows it (service/collective/sharded_reduce.h), runs its own
  // exchanges and no batched round.
  PolicyDecision decision;
  std::shared_ptr<const codecs::Codec> codec;
  const codecs::SingleRoundCodec* shardable = nullptr;
  if (in.mode == ReduceMode::kAverage) {
    decision = DecideCodec(in, numel);
    GC_ASSIGN_OR_RETURN(codec, codecs_.Get(decision.codec));
    shardable = ShardableCodec(decision.aggregation, *codec,
                               collective_->world_size(), numel);
    if (shardable == nullptr) {
      batch_kind = codecs::RoundCollective(codec->info());
    }
  }

  // Limits: the memory this reduce allocates, reserved before any of it
  // is, then the job's quotas (docs/daemon.md, "Limits"); in this order, a
  // unary request's input counts while it waits for an import of its job.
  // A gossip request takes its job's ticket first: its node's spec check
  // waits for the other ranks, and the job must be busy meanwhile, or
  // ReleaseJob (refused for a busy job) would free the node under it.
  // Gossip's messages and copies are known then and join the reservation.
  std::optional<JobQuotas::Ticket> ticket;
  GossipNode* gossip_node = nullptr;
  uint64_t gossip_bytes = 0;
  if (in.mode == ReduceMode::kGossip) {
    GC_ASSIGN_OR_RETURN(JobQuotas::Ticket admitted,
                        quotas_.Admit(in.job, in.tensor));
    ticket.emplace(std::move(admitted));
    GC_ASSIGN_OR_RETURN(gossip_node, gossip_.Node(in.job, in.gossip));
    gossip_bytes = gossip_node->WorkingBytes(in.shape);
  }
  // Decided first, as the sample takes memory of its own; a tensor that
  // then holds NaN or Inf is not measured.
  const bool sample = in.mode != ReduceMode::kGossip && SampleError();
  MemoryBudget::Reservation own_reservation;
  GC_RETURN_IF_ERROR(ReserveWorkingMemory(in, numel, width, sample,
                                          gossip_bytes, &own_reservation));
  if (!ticket.has_value()) {
    GC_ASSIGN_OR_RETURN(JobQuotas::Ticket admitted,
                        quotas_.Admit(in.job, in.tensor));
    ticket.emplace(std::move(admitted));
  }
  // What the reduce reserves as it goes: the caller's, which holds its
  // input too, or its own.
  MemoryBudget::Reservation* const held =
      in.reservation != nullptr ? in.reservation : &own_reservation;

  // fp32 is read in place; other dtypes (and unaligned bytes) are converted.
  std::unique_ptr<float[]> converted;
  absl::Span<const float> grad;
  if (IsAlignedFloat32(in.dtype, in.data.data())) {
    grad = {reinterpret_cast<const float*>(in.data.data()), numel};
  } else {
    converted = UninitializedFloats(numel);
    GC_RETURN_IF_ERROR(
        DecodeToFloat(in.dtype, in.data, {converted.get(), numel}));
    grad = {converted.get(), numel};
  }
  const codecs::Nonfinite nonfinite = codecs::CountNonfinite(grad);
  stats.nonfinite_values = nonfinite.count;
  if (nonfinite.count > 0) metrics_->AddNonfinite(nonfinite.count);
  if (in.mode == ReduceMode::kGossip) {
    if (nonfinite.count > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "input holds ", nonfinite.count, " NaN/Inf values (first at index ",
          nonfinite.first, ": ", grad[nonfinite.first],
          "); gossip would send them to the neighbours and keep them in its "
          "edge state, expected finite values"));
    }
    return GossipReduce(in, gossip_node, grad, width, std::move(out),
                        codec_label);
  }

  const codecs::CodecInfo& info = codec->info();
  *codec_label = info.name;
  stats.codec = info.name;
  stats.dense_reason = std::move(decision.dense_reason);

  if (nonfinite.count > 0 && info.family != "dense") {
    return NonfiniteRefused(
        absl::StrCat(nonfinite.count, " NaN/Inf values (first at index ",
                     nonfinite.first, ": ", grad[nonfinite.first], ")"),
        info.name);
  }

  codecs::StateStore::Locked state =
      store_->Acquire(in.job, in.tensor, in.shape, static_cast<int>(in.dtype),
                      codecs::StateOwnerOf(info));
  // However the reduce ends, the state's size then counts (recorded while
  // it is still locked).
  absl::Cleanup record_state = [&] { RecordState(in.job, in.tensor, *state); };
  // A step that fails gives back a state that this request's shape, dtype
  // or codec reset: a request refused for a wrong shape loses nothing.
  absl::Cleanup restore_state = [&] { state.RestoreIfReset(); };
  // Decided before the session starts: a session that will not be asked
  // for its own decode hands its payload over instead of copying it.
  const bool sample_error = nonfinite.count == 0 && sample;
  codecs::StepContext ctx = StepContextOf(in);
  ctx.warmup_offset = decision.warmup_offset;
  ctx.keep_own = sample_error;
  const codecs::TensorView view{grad, in.shape};

  Clock::time_point t = Clock::now();
  // A sharded session runs its own exchanges (all in its first NextRound),
  // so its own stage timings replace the loop's below.
  ShardedSession* sharded = nullptr;
  std::unique_ptr<codecs::CodecSession> session;
  if (shardable != nullptr) {
    // A stateful codec's slices keep copies of their payloads to give the
    // state back should the step fail; with an error sample, the sample's
    // copy (already reserved) is the same one.
    KeepCopies keep;
    if (shardable->info().stateful && !ctx.keep_own) {
      keep = [this, held](uint64_t bytes) {
        return held->GrowTo(held->bytes() + bytes,
                            "this reduce's copies of its slice payloads",
                            options_.memory_wait);
      };
    }
    auto owned = std::make_unique<ShardedSession>(
        *collective_, *store_, *shardable,
        RoundKey{in.job, in.tensor, in.step, 0}, grad, ctx, std::move(keep));
    sharded = owned.get();
    session = std::move(owned);
  } else {
    GC_ASSIGN_OR_RETURN(session, codec->Start(view, *state, ctx));
  }
  // The average goes straight into the result when that is aligned fp32
  // (the caller's span, or the response string); otherwise through fp32
  // scratch and a conversion. A single-round codec that finishes a sum in
  // place has the collective write the sum there too.
  const ResultFloats average(in, numel, width, &out.data);
  const auto* single =
      dynamic_cast<const codecs::SingleRoundCodec*>(codec.get());
  const bool sum_in_place =
      sharded == nullptr && single != nullptr && single->FinishSumInPlace();
  // A stateful single-round codec's session keeps a copy of its payload, to
  // give the state back should the step fail (codecs/codec.cc), unless the
  // error sample already keeps it; its size is known once encoded.
  const bool keeps_undo_copy =
      sharded == nullptr && single != nullptr && info.stateful && !ctx.keep_own;
  for (int round_index = 0;; ++round_index) {
    batch_round = round_index;
    GC_ASSIGN_OR_RETURN(std::optional<codecs::Round> round,
                        session->NextRound());
    stats.encode_seconds += SecondsSince(t);
    if (!round.has_value()) break;
    if (round_index == 0 && keeps_undo_copy) {
      GC_RETURN_IF_ERROR(held->GrowTo(held->bytes() + round->payload.size(),
                                      "this reduce's copy of its payload",
                                      options_.memory_wait));
    }
    if (sum_in_place && round->collective == codecs::Collective::kSum) {
      round->sum_into = average.values();
    }
    stats.wire_bytes += round->payload.size();
    t = Clock::now();
    const RoundKey key{in.job, in.tensor, in.step, round_index};
    GC_ASSIGN_OR_RETURN(
        codecs::RoundResult result,
        batch != nullptr ? batching_.RunBatched(key, *batch, std::move(*round))
                         : collective_->Run(key, std::move(*round)));
    stats.collective_seconds += SecondsSince(t);
    t = Clock::now();
    GC_RETURN_IF_ERROR(session->Absorb(std::move(result)));
    stats.decode_seconds += SecondsSince(t);
    t = Clock::now();
  }
  t = Clock::now();
  GC_RETURN_IF_ERROR(session->Finish(average.values()));
  GC_RETURN_IF_ERROR(average.Commit());
  std::move(restore_state).Cancel();  // the step is done: its state stays
  stats.decode_seconds += SecondsSince(t);
  if (sharded != nullptr) {
    stats.wire_bytes = sharded->stats().wire_bytes;
    stats.encode_seconds = sharded->stats().encode_seconds;
    stats.collective_seconds = sharded->stats().collective_seconds;
    stats.decode_seconds += sharded->stats().decode_seconds;
  }

  stats.raw_bytes = numel * sizeof(float);
  stats.relative_error = std::numeric_limits<double>::quiet_NaN();
  if (sample_error) {
    std::unique_ptr<float[]> own = UninitializedFloats(numel);
    GC_RETURN_IF_ERROR(session->DecodeOwn({own.get(), numel}));
    const SquareSums sums = SumSquares(grad, {own.get(), numel});
    stats.relative_error = RelativeError(sums);
    // Sharded residuals live in per-slice states (sharded_reduce.h); the
    // tensor's own would be a stale one from an earlier allgather step.
    if (std::optional<absl::Span<float>> residual = FindResidual(*state);
        sharded == nullptr && residual.has_value() &&
        std::isfinite(stats.relative_error)) {
      // ||residual|| / ||grad||, with ||grad||^2 from the sums above (> 0:
      // the relative error is finite).
      metrics_->ObserveResidualNorm(
          stats.codec, std::sqrt(SumSquares(*residual, {}).norm / sums.norm));
    }
  }
  return out;
}

absl::StatusOr<uint64_t> Engine::CheckSize(const ReduceInput& in, size_t width,
                                           uint64_t data_bytes,
                                           uint64_t output_bytes) {
  absl::StatusOr<uint64_t> checked_numel =
      CheckedNumel(in.shape, width, options_.max_tensor_bytes);
  if (absl::IsResourceExhausted(checked_numel.status())) {
    metrics_->CountResourceExhausted("tensor_bytes");
  }
  GC_ASSIGN_OR_RETURN(const uint64_t numel, std::move(checked_numel));
  if (data_bytes != numel * width) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data has ", data_bytes, " bytes, expected ", numel * width, " (shape ",
        ShapeString(in.shape), " x ", DTypeName(in.dtype), ")"));
  }
  GC_RETURN_IF_ERROR(declared_.Check(in.job, in.tensor, in.dtype, in.shape));
  if (output_bytes != 0 && output_bytes != numel * width) {
    return absl::InvalidArgumentError(absl::StrCat(
        "output buffer has ", output_bytes, " bytes, expected ", numel * width,
        " (shape ", ShapeString(in.shape), " x ", DTypeName(in.dtype), ")"));
  }
  return numel;
}

codecs::StepContext Engine::StepContextOf(const ReduceInput& in) const {
  codecs::StepContext ctx;
  ctx.seed = options_.seed;
  ctx.tensor_id = codecs::TensorId(in.tensor);
  ctx.step = in.step;
  ctx.rank = collective_->rank();
  ctx.world_size = collective_->world_size();
  return ctx;
}

PolicyDecision Engine::DecideCodec(const ReduceInput& in,
                                   uint64_t numel) const {
  const std::shared_ptr<const PolicySnapshot> scheduled =
      policies_.For(in.step);
  if (!in.codec.has_value()) {
    return Decide(scheduled->policy,
                  {in.tensor, numel, static_cast<uint32_t>(in.shape.size()),
                   in.dtype, in.step});
  }
  PolicyDecision decision;
  decision.codec = *in.codec;
  if (decision.codec.name == kDenseCodec) decision.dense_reason = "request";
  decision.aggregation = scheduled->policy.aggregation;
  return decision;
}

Engine::DevicePlan Engine::PlanDevice(const ReduceInput& in) {
  DevicePlan plan;
  // Only a plain fp32 average of a valid, non-empty tensor runs on the GPU;
  // the staged path reports whatever is wrong with the others.
  if (in.mode != ReduceMode::kAverage || in.batch != nullptr ||
      in.dtype != DType::kFloat32 || in.consensus_distance != 0) {
    return plan;
  }
  absl::StatusOr<uint64_t> numel =
      CheckedNumel(in.shape, sizeof(float), options_.max_tensor_bytes);
  if (!numel.ok() || *numel == 0 ||
      *numel * sizeof(float) != in.device->byte_size) {
    return plan;
  }
  PolicyDecision decision = DecideCodec(in, *numel);
  absl::StatusOr<std::shared_ptr<const codecs::Codec>> codec =
      codecs_.Get(decision.codec);
  // Sharded aggregation re-encodes slices at their owners: host work.
  if (!codec.ok() ||
      ShardableCodec(decision.aggregation, **codec, collective_->world_size(),
                     *numel) != nullptr) {
    return plan;
  }
  plan.twin = device_codecs_.Get(decision.codec);
  plan.decision = std::move(decision);
  plan.codec = *std::move(codec);
  plan.numel = *numel;
  return plan;
}

absl::StatusOr<ReduceOutput> Engine::ReduceOnDevice(const ReduceInput& in,
                                                    DevicePlan plan,
                                                    std::string* codec_label) {
  GC_RETURN_IF_ERROR(CheckNames(in));
  GC_RETURN_IF_ERROR(gossip_.CheckAverage(in.job));
  const DeviceTensor& device = *in.device;
  GC_ASSIGN_OR_RETURN(
      const uint64_t numel,
      CheckSize(in, sizeof(float), device.byte_size, device.byte_size));
  GC_ASSIGN_OR_RETURN(const JobQuotas::Ticket ticket,
                      quotas_.Admit(in.job, in.tensor));
  // Host memory: this worker's payload and the collective's result.
  MemoryBudget::Reservation own_reservation;
  GC_RETURN_IF_ERROR(ReserveWorkingMemory(in, numel, sizeof(float),
                                          /*sample_error=*/false, /*extra=*/0,
                                          &own_reservation));

  const codecs::CodecInfo& info = plan.codec->info();
  *codec_label = info.name;
  ReduceOutput out;
  ReduceStats& stats = out.stats;
  // NaN/Inf as on the host path (ReduceImpl), counted on the device.
  GC_ASSIGN_OR_RETURN(
      stats.nonfinite_values,
      CountNonfiniteOnDevice(device.device_id,
                             static_cast<const float*>(device.input), numel));
  if (stats.nonfinite_values > 0) {
    metrics_->AddNonfinite(stats.nonfinite_values);
    if (info.family != "dense") {
      return NonfiniteRefused(
          absl::StrCat(stats.nonfinite_values, " NaN/Inf values"), info.name);
    }
  }
  stats.world_size = collective_->world_size();
  stats.codec = info.name;
  stats.backend = "cuda";
  stats.dense_reason = std::move(plan.decision.dense_reason);
  stats.raw_bytes = numel * sizeof(float);
  // Not measured on the device yet (it needs the gradient on the host).
  stats.relative_error = std::numeric_limits<double>::quiet_NaN();

  codecs::StateStore::Locked state =
      store_->Acquire(in.job, in.tensor, in.shape, static_cast<int>(in.dtype),
                      codecs::StateOwnerOf(info));
  absl::Cleanup record_state = [&] { RecordState(in.job, in.tensor, *state); };
  // As on the host: a failed step gives back a state its request reset.
  absl::Cleanup restore_state = [&] { state.RestoreIfReset(); };
  codecs::StepContext ctx = StepContextOf(in);
  ctx.warmup_offset = plan.decision.warmup_offset;

  Clock::time_point t = Clock::now();
  codecs::Round round;
  round.collective = codecs::RoundCollective(info);
  const auto* grad = static_cast<const float*>(device.input);
  GC_RETURN_IF_ERROR(plan.twin->Encode(device.device_id, grad, numel,
                                       in.shape.empty() ? 1 : in.shape[0],
                                       *state, ctx, &round.payload));
  // From here a failed step gives the state back, as a codec session does.
  const codecs::Bytes sent = info.stateful ? round.payload : codecs::Bytes();
  absl::Cleanup revert = [&] {
    if (!info.stateful) return;
    plan.twin->Revert(device.device_id, grad, numel, in.shape, *state, ctx,
                      sent);
  };
  stats.encode_seconds = SecondsSince(t);
  stats.wire_bytes = round.payload.size();
  t = Clock::now();
  GC_ASSIGN_OR_RETURN(
      codecs::RoundResult result,
      collective_->Run({in.job, in.tensor, in.step, 0}, std::move(round)));
  stats.collective_seconds = SecondsSince(t);
  t = Clock::now();
  GC_RETURN_IF_ERROR(plan.twin->Finish(device.device_id, result, ctx,
                                       static_cast<float*>(device.output),
                                       numel));
  std::move(revert).Cancel();
  std::move(restore_state).Cancel();
  stats.decode_seconds = SecondsSince(t);
  return out;
}

absl::StatusOr<ReduceOutput> Engine::ReduceStaged(const ReduceInput& in,
                                                  std::string* codec_label) {
  const DeviceTensor& device = *in.device;
  // Refused before the host reduce (which leaves the batch itself): leave
  // it here.
  bool handed_over = false;
  absl::Cleanup leave_batch = [&] {
    if (!handed_over && in.batch != nullptr) {
      LeaveBatch(in.job, in.tensor, in.step, *in.batch);
    }
  };
  // Both host copies count against the memory budget until the reduce ends.
  MemoryBudget::Reservation own;
  MemoryBudget::Reservation* held = in.reservation;
  const uint64_t bytes = 2 * device.byte_size;
  if (held != nullptr) {
    GC_RETURN_IF_ERROR(held->GrowTo(held->bytes() + bytes,
                                    "its CUDA slice's host copies",
                                    options_.memory_wait));
  } else {
    GC_ASSIGN_OR_RETURN(own,
                        budget_.Reserve(bytes, "its CUDA slice's host copies",
                                        options_.memory_wait));
    held = &own;
  }
  std::string input(device.byte_size, '\0');
  std::string output(device.byte_size, '\0');
  GC_RETURN_IF_ERROR(
      CopyDeviceToHost(device.device_id, device.input, absl::MakeSpan(input)));
  ReduceInput staged = in;
  staged.device = nullptr;
  staged.data = input;
  staged.output = absl::MakeSpan(output);
  staged.reservation = held;
  handed_over = true;
  GC_ASSIGN_OR_RETURN(ReduceOutput out, ReduceImpl(staged, codec_label));
  GC_RETURN_IF_ERROR(CopyHostToDevice(device.device_id, output, device.output));
  return out;
}

absl::StatusOr<ReduceOutput> Engine::GossipReduce(
    const ReduceInput& in, GossipNode* node, absl::Span<const float> grad,
    size_t width, ReduceOutput out, std::string* codec_label) {
  const GossipOptions::Mode mode = node->options().mode;
  ReduceStats& stats = out.stats;
  *codec_label = mode == GossipOptions::Mode::kExact   ? "gossip"
                 : mode == GossipOptions::Mode::kChoco ? "choco-topk"
                                                       : "powergossip";
  stats.codec = *codec_label;
  stats.raw_bytes = grad.size() * sizeof(float);
  stats.relative_error = std::numeric_limits<double>::quiet_NaN();

  // The edges' factors live in the tensor's codec state, so that they are
  // exported, imported, counted and reset with it. They are fp32 whatever
  // the tensor's dtype, and the neighbours hold their halves: a rank that
  // changes the dtype keeps them (a change of shape resets them).
  codecs::StateStore::Locked state = store_->Acquire(
      in.job, in.tensor, in.shape, static_cast<int>(DType::kFloat32));
  absl::Cleanup record_state = [&] { RecordState(in.job, in.tensor, *state); };
  const ResultFloats mixed(in, grad.size(), width, &out.data);
  std::copy(grad.begin(), grad.end(), mixed.values().begin());
  const Clock::time_point t = Clock::now();
  // A mix the tensor's dtype cannot hold (fp16 above 65504) fails the
  // round, its edges kept, instead of coming back as Inf.
  GC_ASSIGN_OR_RETURN(
      GossipStats gossip,
      node->Round(*collective_, {in.job, in.tensor, in.step, 0}, in.shape,
                  mixed.values(), *state, FirstMagnitudeToInf(in.dtype)));
  stats.collective_seconds = SecondsSince(t);
  GC_RETURN_IF_ERROR(mixed.Commit());
  stats.wire_bytes = gossip.bytes_sent;
  const absl::Span<const Neighbour> neighbours =
      node->topology().neighbours(collective_->rank());
  for (size_t e = 0; e < neighbours.size(); ++e) {
    metrics_->AddGossipBytes(neighbours[e].rank, gossip.bytes_to_neighbour[e]);
  }
  for (const EdgeResync& edge : gossip.resynced) {
    metrics_->CountGossipEdgeResync(edge.neighbour);
    std::fprintf(stderr,
                 "gradcompd: gossip of job '%s' tensor '%s' step %lld: the "
                 "edge with rank %d was out of step (this end at power step "
                 "%llu, the neighbour at %llu); both ends start it again from "
                 "fresh factors\n",
                 in.job.c_str(), in.tensor.c_str(),
                 static_cast<long long>(in.step), edge.neighbour,
                 static_cast<unsigned long long>(edge.this_end),
                 static_cast<unsigned long long>(edge.neighbour_end));
  }
  return out;
}

}  // namespace gradcomp::service
