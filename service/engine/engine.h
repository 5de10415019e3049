// The reduce pipeline of one tensor, in core types (no proto, no gRPC):
// validate the input, convert it to fp32, let the policy (or the request's
// override) choose a codec, run the codec's rounds through the Collective,
// decode the average and convert it back to the request's dtype. Every
// call, failed or not, is counted in the metrics.
//
//   GC_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
//                       Engine::Create(options, BuiltinCodecs(), &store,
//                                      &collective, &metrics, Policy()));
//   GC_ASSIGN_OR_RETURN(ReduceOutput out, engine->Reduce(input));
#ifndef GRADCOMP_SERVICE_ENGINE_ENGINE_H_
#define GRADCOMP_SERVICE_ENGINE_ENGINE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "codecs/codec.h"
#include "codecs/registry.h"
#include "codecs/state.h"
#include "service/collective/batching_collective.h"
#include "service/collective/collective.h"
#include "service/engine/codec_cache.h"
#include "service/engine/device_codecs.h"
#include "service/engine/dtype.h"
#include "service/engine/gossip_jobs.h"
#include "service/engine/job_quotas.h"
#include "service/engine/memory_budget.h"
#include "service/engine/policy.h"
#include "service/engine/policy_schedule.h"
#include "service/engine/tensor_list.h"
#include "service/metrics/metrics.h"

namespace gradcomp::service {

// The rendezvous name of DeclareTensors' exchange; '#' cannot appear in a
// client's tensor names.
inline constexpr absl::string_view kTensorListKey = "#tensor-list";

struct EngineOptions {
  uint64_t seed = 0;  // job seed for the codecs' Philox streams
  // Fraction of reduces whose relative error is measured (one extra decode
  // of the worker's own payload); in [0, 1]. Every reduce here, for the
  // in-process engine of tests and benches; the daemon's default is 0.1
  // (service/config DefaultConfig, docs/daemon.md).
  double error_sample_rate = 1.0;
  // Largest input accepted, in bytes (of the request's dtype).
  uint64_t max_tensor_bytes = uint64_t{4} << 30;
  // How long a batched reduce waits for the other members of its batch on
  // this rank (batching_collective.h); the daemon uses its collective
  // timeout.
  absl::Duration batch_timeout = absl::Seconds(60);
  // Limits (docs/daemon.md, "Limits"): bytes that in-flight reduces and
  // codec state may hold, how long a reduce waits for room before it fails
  // with ResourceExhausted, and the per-job quotas.
  uint64_t memory_budget_bytes = uint64_t{8} << 30;
  absl::Duration memory_wait = absl::Seconds(10);
  JobQuotaOptions quotas;
};

// A tensor in GPU memory (a CUDA IPC slice). Its codec runs on the GPU when
// it has a twin there (device_codecs.h) and the reduce is a plain fp32
// average; otherwise the engine copies it to the host, reduces it as any
// other and copies the average back.
struct DeviceTensor {
  int device_id = 0;
  const void* input = nullptr;  // byte_size bytes on device `device_id`
  void* output = nullptr;       // where the average goes; byte_size bytes
  uint64_t byte_size = 0;
};

struct ReduceInput {
  std::string job;
  std::string tensor;
  int64_t step = 0;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;  // empty: a scalar
  absl::string_view data;      // raw little-endian bytes; outlive the call
  // When non-empty, the average is written here in the request's dtype
  // (exactly numel * width bytes, else InvalidArgument before any
  // collective) and ReduceOutput::data stays empty.
  absl::Span<char> output;
  std::optional<CodecSpec> codec;  // overrides the policy when set
  // Set: the SUM rounds travel in one collective with the batch's other
  // members (world size > 1; alone, it is checked and ignored). Made by
  // MakeBatchSpec from the request's ReduceBatch, once per request: the
  // parts of a request share it.
  std::shared_ptr<const BatchSpec> batch;
  // Bytes of the memory budget the caller already holds for this request
  // (its inline input, reserved when it arrived); the engine grows it by
  // the reduce's own working memory. Null: the engine reserves on its own,
  // `unreserved_input_bytes` (what the caller holds of the request and has
  // not reserved) with its working memory in one piece: a reduce that held
  // its input while it waited for the rest would keep others from the room
  // they need (concurrent arrivals could each hold an input and all wait).
  MemoryBudget::Reservation* reservation = nullptr;
  // Of `reservation`, what the caller reserved for the working memory
  // ahead (WorkingBytesAhead): the engine grows it by what more the reduce
  // takes, or gives back what it takes less.
  uint64_t reserved_working_bytes = 0;
  uint64_t unreserved_input_bytes = 0;  // used only without `reservation`
  // kGossip: the result is this worker's tensor mixed with its neighbours'
  // on `gossip`'s topology (gossip_jobs.h) instead of the average; `codec`
  // and the policy are not used, and `batch` is refused.
  ReduceMode mode = ReduceMode::kAverage;
  GossipSpec gossip;
  // Client-reported consensus distance, exported per job; 0: not reported.
  double consensus_distance = 0;
  // Set: the input and the output are in GPU memory, and `data` and
  // `output` are empty.
  const DeviceTensor* device = nullptr;
};

struct ReduceStats {
  std::string codec;            // the codec that ran
  std::string backend = "cpu";  // where it ran: "cpu" or "cuda"
  uint64_t raw_bytes = 0;       // numel * 4
  uint64_t wire_bytes = 0;      // payload bytes this worker sent, all rounds
  // ||g - D(C(g))|| / ||g||; NaN when not sampled, when ||g|| = 0 or when
  // the input held NaN/Inf.
  double relative_error = 0;
  double encode_seconds = 0;
  double collective_seconds = 0;
  double decode_seconds = 0;
  double total_seconds = 0;
  int world_size = 1;
  std::string dense_reason;  // policy.h, plus "request" and "empty"
  uint64_t nonfinite_values = 0;
};

struct ReduceOutput {
  std::string data;  // the average, in the request's dtype; empty when
                     // ReduceInput::output received it
  ReduceStats stats;
};

class Engine {
 public:
  // InvalidArgument if `options` or `policy` are invalid. The registry,
  // store, collective and metrics must outlive the engine.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(
      const EngineOptions& options, const codecs::CodecRegistry& registry,
      codecs::StateStore* store, Collective* collective, Metrics* metrics,
      Policy policy);

  // The caller's last step of a reduce that can still fail it: the service
  // copies a staged output to its device and checks that the client's
  // shared memory stayed backed.
  using Deliver = std::function<absl::Status()>;

  // Thread-safe; tensors of one job may be reduced concurrently (calls for
  // the same tensor are serialised by its state lock). Errors are prefixed
  // with "tensor '<name>' step <n>: ". A tensor with zero elements returns
  // empty data at once, without a collective. `deliver`, when given, runs
  // after a reduce that succeeded and before the reduce is counted in the
  // metrics, so that they count what the caller got.
  absl::StatusOr<ReduceOutput> Reduce(const ReduceInput& input,
                                      const Deliver& deliver = nullptr);

  using PolicySnapshot = PolicySchedule::Entry;
  // The policy set last (policy_schedule.h): what GetPolicy shows.
  std::shared_ptr<const PolicySnapshot> policy() const {
    return policies_.Latest();
  }
  // What peers compare at their handshake: PolicySchedule::ScheduleHash.
  std::string policy_schedule_hash() const { return policies_.ScheduleHash(); }

  // Validates `policy` first and swaps it in atomically: a Reduce sees the
  // old policy or the new one, never a mix. Without `from_step` it decides
  // every reduce from now on; with it, those of steps >= *from_step (>= 0),
  // so that ranks sent the same call switch at the same step whenever the
  // call reaches each. Returns the new hash.
  absl::StatusOr<std::string> SetPolicy(
      Policy policy, std::optional<int64_t> from_step = std::nullopt);

  // Checks that every rank of the job declares the same tensor list (an
  // allgather of the lists, met by `generation`: declare again with a new
  // generation to change the list) and from then on accepts only declared
  // tensors, with their declared dtype and shape, in Reduce calls of `job`.
  // Returns the list's hash. FailedPrecondition naming the first difference
  // and both ranks when the lists differ; the collective's errors (deadline,
  // missing rank) otherwise.
  absl::StatusOr<std::string> DeclareTensors(
      absl::string_view job, int64_t generation,
      absl::Span<const TensorDecl> decls);

  // FailedPrecondition while a reduce or import of `job` is in flight.
  absl::StatusOr<std::string> ExportState(absl::string_view job);
  absl::Status ImportState(absl::string_view job, absl::string_view blob);

  // Frees everything this daemon holds for `job`: its codec state (and so
  // its memory budget and quotas), its tensor list, its gossip mode and
  // edges, its rendezvous steps and its per-job metric series. A reduce of
  // the job after this starts afresh, as on a new daemon. Only this rank's
  // daemon forgets the job; each worker releases its own. FailedPrecondition
  // while a reduce or an import of the job is in flight here.
  absl::StatusOr<ReleasedJob> ReleaseJob(absl::string_view job);

  // The daemon is stopping: reduces waiting for peers or batch members fail
  // at once with `why` (Collective::Shutdown), as do later ones that reach
  // their collective.
  void Shutdown(const absl::Status& why) { batching_.Shutdown(why); }

  int rank() const { return collective_->rank(); }
  int world_size() const { return collective_->world_size(); }
  const codecs::CodecRegistry& registry() const { return registry_; }

  // Reserves `bytes` of a request's own input (inline data that came with
  // it) in the memory budget, waiting as a reduce does (--memory_wait, but
  // not past `deadline`), for `what` (named in the error); hand it to
  // Reduce in ReduceInput::reservation.
  absl::StatusOr<MemoryBudget::Reservation> ReserveInput(
      uint64_t bytes, absl::string_view what,
      absl::Time deadline = absl::InfiniteFuture());
  // How long a reservation waits for room (--memory_wait), and the whole
  // budget.
  absl::Duration memory_wait() const { return options_.memory_wait; }
  uint64_t memory_budget_bytes() const { return options_.memory_budget_bytes; }
  // The working memory a reduce of `shape` x `dtype` takes, as
  // Reduce reserves it for an aligned input without an error sample: what
  // a caller reserves with a request's input when the request arrives
  // (ReduceInput::reserved_working_bytes), so that a request that waits
  // for a worker never holds its input while the worker waits for the
  // rest. `input_bytes`: what the request brings (inline or in shared
  // memory). `output_inline`: the result goes into the response. `gossip`
  // (null in average mode): the request gossips in job `job` with this
  // spec, and its messages and copies count too. 0 for a dtype or a shape
  // the reduce refuses, and for input bytes the shape does not need (a
  // malformed request holds no more than its own bytes until the reduce
  // refuses it, InvalidArgument, as a unary one is).
  uint64_t WorkingBytesAhead(absl::string_view job, DType dtype,
                             absl::Span<const int64_t> shape,
                             uint64_t input_bytes, bool output_inline,
                             const GossipSpec* gossip);

  // Member `tensor` of `batch` takes part in no round >= `round` of `step`:
  // the batch's other members go on without it at once instead of waiting
  // for it until the batch's deadline. Reduce leaves the batch itself
  // however it ends; callers leave it from round 0 for a request refused
  // before Reduce.
  void LeaveBatch(const std::string& job, const std::string& tensor,
                  int64_t step, const BatchSpec& batch, int round = 0,
                  std::optional<codecs::Collective> kind = std::nullopt);

 private:
  // This daemon's rank and world size, as its exported state records them.
  codecs::StateOrigin StateOriginOfThisRank() const {
    return {collective_->rank(), collective_->world_size()};
  }
  Engine(const EngineOptions& options, const codecs::CodecRegistry& registry,
         codecs::StateStore* store, Collective* collective, Metrics* metrics,
         Policy policy);

  // The pipeline; `codec_label` is set once the codec is known, for the
  // metrics Reduce records whatever the outcome.
  absl::StatusOr<ReduceOutput> ReduceImpl(const ReduceInput& input,
                                          std::string* codec_label);
  // The request's batch, checked against the tensor (and a declared tensor
  // list); null when it has none or when batching saves nothing (world
  // size 1).
  absl::StatusOr<std::shared_ptr<const BatchSpec>> ResolveBatch(
      const ReduceInput& in) const;
  // Reserves the memory budget for the buffers ReduceImpl allocates (with
  // the error sample's when `sample_error`, and `extra` more: gossip's
  // messages and copies): into `in.reservation` when the caller holds one,
  // else into `own`, with `in.unreserved_input_bytes`, in one piece.
  absl::Status ReserveWorkingMemory(const ReduceInput& in, uint64_t numel,
                                    size_t width, bool sample_error,
                                    uint64_t extra,
                                    MemoryBudget::Reservation* own);
  // What a device tensor's reduce would run on the GPU; `twin` is null
  // when it must be staged through the host instead.
  struct DevicePlan {
    std::shared_ptr<const DeviceCodec> twin;
    PolicyDecision decision;
    std::shared_ptr<const codecs::Codec> codec;
    uint64_t numel = 0;
  };
  DevicePlan PlanDevice(const ReduceInput& in);
  // A device tensor's reduce with its codec's GPU twin: only the payloads
  // and the collective's result cross to the host.
  absl::StatusOr<ReduceOutput> ReduceOnDevice(const ReduceInput& in,
                                              DevicePlan plan,
                                              std::string* codec_label);
  // A device tensor's reduce through a host copy, with the CPU codec.
  absl::StatusOr<ReduceOutput> ReduceStaged(const ReduceInput& in,
                                            std::string* codec_label);
  // The codecs' view of `in`'s step: seed, tensor id, step, rank, world.
  codecs::StepContext StepContextOf(const ReduceInput& in) const;
  // The policy's (or the request's) codec for `in` of `numel` elements.
  PolicyDecision DecideCodec(const ReduceInput& in, uint64_t numel) const;
  // `in`'s element count, checked against its shape, the declared tensor
  // list and its input and output byte counts (output 0: none given).
  absl::StatusOr<uint64_t> CheckSize(const ReduceInput& in, size_t width,
                                     uint64_t data_bytes,
                                     uint64_t output_bytes);
  // ReduceImpl's gossip mode on `node` (the job's), from the input as fp32
  // (`grad`) on; the round's messages are reserved already.
  absl::StatusOr<ReduceOutput> GossipReduce(const ReduceInput& in,
                                            GossipNode* node,
                                            absl::Span<const float> grad,
                                            size_t width, ReduceOutput out,
                                            std::string* codec_label);
  // Counts against the job's quota and the memory budget the codec state
  // (job, tensor) holds now, `state` being its entry (whose lock the caller
  // holds): that entry and any that sharded aggregation keeps for the
  // tensor (sharded_reduce.h), whatever path this step took, since they
  // stay in the store when the policy or the path (host or GPU) changes.
  void RecordState(const std::string& job, const std::string& tensor,
                   const codecs::TensorState& state);
  void RecordSuccess(const ReduceStats& stats);
  bool SampleError();

  const EngineOptions options_;
  const codecs::CodecRegistry& registry_;
  codecs::StateStore* const store_;
  Collective* const collective_;
  BatchingCollective batching_;  // around collective_
  Metrics* const metrics_;
  CodecCache codecs_;
  DeviceCodecs device_codecs_;
  DeclaredTensors declared_;
  MemoryBudget budget_;
  JobQuotas quotas_;
  GossipJobs gossip_;
  std::atomic<uint64_t> reduces_{0};
  PolicySchedule policies_;
};

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_ENGINE_ENGINE_H_
