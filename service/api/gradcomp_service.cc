#include "service/api/gradcomp_service.h"

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/status_macros.h"
#include "codecs/wire.h"
#include "service/api/convert.h"
#include "service/api/grpc_status.h"
#include "service/api/request_parts.h"
#include "service/api/stream_outbox.h"
#include "service/config/policy_proto.h"
#include "service/engine/device_codecs.h"
#include "service/engine/tensor_list.h"
#include "service/version.h"

namespace gradcomp::service {

namespace {

// The metadata key a client names itself with (gradcomp.proto, "Shared
// memory"); its shared-memory regions belong to that name.
constexpr char kClientIdKey[] = "gradcomp-client-id";

// Who owns shared-memory regions: the id the client sends, else the
// address of its connection (which changes if the channel reconnects).
// None for a caller without an id on a unix socket, whose address is the
// same "unix:" for every connection (UnidentifiedClient says what to do).
// An empty id is no id: every caller that sent one would be one client.
std::optional<std::string> ClientId(const grpc::ServerContext& context) {
  const auto& metadata = context.client_metadata();
  if (auto it = metadata.find(kClientIdKey);
      it != metadata.end() && !it->second.empty()) {
    return std::string(it->second.data(), it->second.size());
  }
  std::string peer = context.peer();
  if (absl::StartsWith(peer, "unix") && absl::EndsWith(peer, ":")) {
    return std::nullopt;
  }
  return peer;
}

// The refusal of shared memory to a caller ClientId cannot tell apart from
// the others on its socket: its regions would be everyone's.
absl::Status UnidentifiedClient() {
  return absl::InvalidArgumentError(absl::StrCat(
      "shared memory over a unix socket needs the '", kClientIdKey,
      "' metadata naming the client (the gradcomp Python and C++ clients "
      "send it): without it every caller on the socket is the same client "
      "and could use the others' regions"));
}

absl::Status Prefixed(const absl::Status& status, absl::string_view prefix) {
  return absl::Status(status.code(),
                      absl::StrCat(prefix, ": ", status.message()));
}

std::string TensorLabel(const v1::ReduceRequest& request) {
  return absl::StrCat("tensor '", request.tensor(), "' step ", request.step());
}

// What an error answer names, and what leaving the request's batch needs
// (GradcompService::LeaveBatch), kept apart from a request that moves on.
v1::ReduceRequest NamedPart(const v1::ReduceRequest& request) {
  v1::ReduceRequest named;
  named.set_job(request.job());
  named.set_tensor(request.tensor());
  named.set_step(request.step());
  named.set_request_id(request.request_id());
  if (request.has_batch()) *named.mutable_batch() = request.batch();
  return named;
}

// Bad messages in a row that ReadParsed reads past: each read costs the end
// of every stream a Read more.
constexpr int kMaxUnparsedInARow = 8;

// Reads a client stream's next message into `message`. gRPC's sync Read is
// false at the client's half-close and also for a message it cannot parse,
// after which the stream goes on: so a false Read is tried again, up to
// kMaxUnparsedInARow times, and `*unparsed` counts the messages passed over
// before one that parsed. False at the end of the stream or a cancel; bad
// messages just before the end, or more than kMaxUnparsedInARow in a row,
// cannot be told from it.
template <typename Stream, typename Message>
bool ReadParsed(const grpc::ServerContext& context, Stream& stream,
                Message* message, uint64_t* unparsed) {
  for (int failed = 0;; ++failed) {
    if (stream.Read(message)) {
      *unparsed += failed;
      return true;
    }
    if (context.IsCancelled() || failed == kMaxUnparsedInARow) return false;
  }
}

// One tensor's ReduceStream answer: its result, or its error.
v1::ReduceStreamResponse StreamAnswer(
    const v1::ReduceRequest& request,
    absl::StatusOr<v1::ReduceResponse> result) {
  v1::ReduceStreamResponse response;
  if (result.ok()) {
    *response.mutable_result() = std::move(*result);
  } else {
    response.set_error_code(static_cast<int>(result.status().code()));
    response.set_error_message(std::string(result.status().message()));
    response.set_tensor(request.tensor());
    response.set_request_id(request.request_id());
  }
  return response;
}

// The answers of a request's parts, gathered until the last one is in.
class PartsAnswer {
 public:
  PartsAnswer(uint64_t request_id, size_t parts) : remaining_(parts) {
    response_.set_request_id(request_id);
    for (size_t i = 0; i < parts; ++i) response_.add_part_results();
  }

  // Records part i's answer and what it keeps until the client reads it;
  // true for the last, whose caller then Takes.
  bool Set(size_t i, v1::ReduceStreamResponse part,
           std::shared_ptr<const void> hold) {
    absl::MutexLock lock(&mu_);
    *response_.mutable_part_results(static_cast<int>(i)) = std::move(part);
    if (hold != nullptr) holds_->push_back(std::move(hold));
    return --remaining_ == 0;
  }

  // The whole answer, and every part's hold in one.
  std::pair<v1::ReduceStreamResponse, std::shared_ptr<const void>> Take() {
    absl::MutexLock lock(&mu_);
    return {std::move(response_), std::move(holds_)};
  }

 private:
  using Holds = std::vector<std::shared_ptr<const void>>;
  absl::Mutex mu_;
  v1::ReduceStreamResponse response_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<Holds> holds_ ABSL_GUARDED_BY(mu_) =
      std::make_shared<Holds>();
  size_t remaining_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

void GradcompService::ClientWait::Begin() {
  absl::MutexLock lock(&mu_);
  since_ = StallWatchdog::Clock::now();
}

void GradcompService::ClientWait::End() {
  absl::MutexLock lock(&mu_);
  since_.reset();
}

std::optional<StallWatchdog::Clock::time_point>
GradcompService::ClientWait::Since() const {
  absl::MutexLock lock(&mu_);
  return since_;
}

GradcompService::GradcompService(Engine* engine, Metrics* metrics,
                                 StreamOptions streams, DaemonSettings settings,
                                 SharedMemoryRegistry* shm)
    : engine_(engine),
      metrics_(metrics),
      settings_(std::move(settings)),
      shm_(shm),
      max_unwritten_bytes_(streams.max_unwritten_bytes),
      stall_watchdog_(streams.stall_timeout),
      stream_pool_(streams.pool, [metrics](const WorkerPool::Stats& stats) {
        metrics->SetStreamPool(stats.running, stats.waiting, stats.idle,
                               stats.queued);
      }) {}

absl::StatusOr<SharedMemorySlice> GradcompService::AcquireSlice(
    const ShmClient& client, const v1::SharedMemorySlice& slice,
    absl::string_view field) {
  if (shm_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(field, ": ", kClientShmOff));
  }
  if (!client.has_value()) return Prefixed(UnidentifiedClient(), field);
  absl::StatusOr<SharedMemorySlice> acquired =
      shm_->Acquire(*client, slice.region(), slice.offset(), slice.byte_size());
  if (!acquired.ok()) return Prefixed(acquired.status(), field);
  return acquired;
}

absl::StatusOr<absl::Span<char>> GradcompService::HostBytes(
    const SharedMemorySlice& slice, bool copy_in, std::vector<char>* host,
    HostStaging* staging) {
  if (!slice.on_device()) return slice.bytes();
  GC_ASSIGN_OR_RETURN(
      MemoryBudget::Reservation reserved,
      engine_->ReserveInput(slice.byte_size(), "its CUDA slice's host copy"));
  staging->reservations.push_back(std::move(reserved));
  host->resize(slice.byte_size());
  if (copy_in) GC_RETURN_IF_ERROR(slice.CopyToHost(absl::MakeSpan(*host)));
  return absl::MakeSpan(*host);
}

absl::StatusOr<ReduceInput> GradcompService::ResolveInput(
    const v1::ReduceRequest& request, const ShmClient& client,
    std::shared_ptr<const BatchSpec> batch,
    std::optional<SharedMemorySlice>* input_slice,
    std::optional<SharedMemorySlice>* output_slice, HostStaging* staging) {
  if (request.has_input_shm()) {
    GC_ASSIGN_OR_RETURN(SharedMemorySlice slice,
                        AcquireSlice(client, request.input_shm(), "input_shm"));
    input_slice->emplace(std::move(slice));
  }
  if (request.has_output_shm()) {
    GC_ASSIGN_OR_RETURN(
        SharedMemorySlice slice,
        AcquireSlice(client, request.output_shm(), "output_shm"));
    output_slice->emplace(std::move(slice));
  }
  MappedSlices slices;
  if (input_slice->has_value() && output_slice->has_value() &&
      (*input_slice)->on_device() && (*output_slice)->on_device() &&
      (*input_slice)->device_id() == (*output_slice)->device_id() &&
      (*input_slice)->byte_size() == (*output_slice)->byte_size()) {
    // Both on one GPU: the engine reads and writes them there. Their device
    // addresses stand in for the spans, for the overlap check only.
    const SharedMemorySlice& in = **input_slice;
    const SharedMemorySlice& out = **output_slice;
    slices.input = {static_cast<char*>(in.device_data()), in.byte_size()};
    slices.output = {static_cast<char*>(out.device_data()), out.byte_size()};
    GC_ASSIGN_OR_RETURN(
        ReduceInput input,
        ReduceInputFromProto(request, slices, std::move(batch)));
    staging->device = {in.device_id(), in.device_data(), out.device_data(),
                       in.byte_size()};
    input.data = absl::string_view();
    input.output = absl::Span<char>();
    input.device = &staging->device;
    return input;
  }
  if (input_slice->has_value()) {
    absl::StatusOr<absl::Span<char>> bytes =
        HostBytes(**input_slice, /*copy_in=*/true, &staging->input, staging);
    if (!bytes.ok()) return Prefixed(bytes.status(), "input_shm");
    slices.input = *bytes;
  }
  if (output_slice->has_value()) {
    absl::StatusOr<absl::Span<char>> bytes =
        HostBytes(**output_slice, /*copy_in=*/false, &staging->output, staging);
    if (!bytes.ok()) return Prefixed(bytes.status(), "output_shm");
    slices.output = *bytes;
  }
  return ReduceInputFromProto(request, slices, std::move(batch));
}

void GradcompService::LeaveBatch(
    const v1::ReduceRequest& request,
    const std::shared_ptr<const BatchSpec>& batch) {
  std::shared_ptr<const BatchSpec> spec = batch;
  if (request.has_batch()) {
    // A batch MakeBatchSpec refuses names no members to tell.
    absl::StatusOr<std::shared_ptr<const BatchSpec>> own =
        BatchSpecFromProto(request.batch());
    if (!own.ok()) return;
    spec = *std::move(own);
  }
  if (spec == nullptr) return;
  engine_->LeaveBatch(request.job(), request.tensor(), request.step(), *spec);
}

absl::StatusOr<MemoryBudget::Reservation> GradcompService::ReserveQueued(
    const v1::ReduceRequest& request, uint64_t* working,
    absl::Time memory_deadline) {
  // By its shape, which the reduce checks against its bytes; a gossip
  // request's messages with it. A mode the reduce refuses is estimated as
  // average.
  const std::optional<GossipSpec> gossip =
      request.mode() == v1::REDUCE_MODE_GOSSIP
          ? std::optional<GossipSpec>(GossipSpecFromProto(request.gossip()))
          : std::nullopt;
  *working = engine_->WorkingBytesAhead(
      request.job(), DTypeFromProto(request.dtype()),
      absl::MakeConstSpan(request.shape().data(), request.shape().size()),
      request.has_input_shm() ? request.input_shm().byte_size()
                              : request.data().size(),
      !request.has_output_shm(), gossip.has_value() ? &*gossip : nullptr);
  return engine_->ReserveInput(request.data().size() + *working,
                               "its inline input and working memory",
                               memory_deadline);
}

absl::StatusOr<v1::ReduceResponse> GradcompService::DoReduce(
    const v1::ReduceRequest& request, const ShmClient& client,
    MemoryBudget::Reservation* held, uint64_t held_working,
    std::shared_ptr<const BatchSpec> batch) {
  if (request.parts_size() > 0) {
    // ReduceStream splits them (SplitParts); one answer cannot hold many.
    metrics_->CountReduce("unresolved", absl::StatusCode::kInvalidArgument);
    return absl::InvalidArgumentError(absl::StrCat(
        "request ", request.request_id(), " has ", request.parts_size(),
        " parts; send requests with parts over ReduceStream"));
  }
  // Held until the reduce returns: the regions stay mapped and count as in
  // flight, so Unregister refuses them meanwhile.
  std::optional<SharedMemorySlice> input_slice, output_slice;
  HostStaging staging;
  const std::shared_ptr<const BatchSpec> batch_of_part = batch;
  absl::StatusOr<ReduceInput> input = ResolveInput(
      request, client, std::move(batch), &input_slice, &output_slice, &staging);
  if (!input.ok()) {
    // Refused before the engine saw it; counted here so that every request
    // shows in gradcomp_reduce_total.
    metrics_->CountReduce("unresolved", input.status().code());
    LeaveBatch(request, batch_of_part);
    return Prefixed(input.status(), TensorLabel(request));
  }
  // The request's bytes count against the memory budget until it returns:
  // a stream's are held since it arrived; a unary call's the engine
  // reserves with its working memory.
  input->reservation = held;
  input->reserved_working_bytes = held_working;
  if (held == nullptr) input->unreserved_input_bytes = request.data().size();
  // Counted by the engine once this has run: a result the client does not
  // get is a failed reduce.
  const auto deliver = [&]() -> absl::Status {
    // A staged CUDA output goes back to its device (the engine wrote an
    // unstaged one there itself).
    if (output_slice.has_value() && output_slice->on_device() &&
        input->device == nullptr) {
      absl::Status written = output_slice->CopyFromHost(staging.output);
      if (!written.ok()) return Prefixed(written, "output_shm");
    }
    // A client that truncated its object while the engine used it: part of
    // the input read as zeros, or part of the average was never written.
    for (const auto& [slice, field] : {std::pair{&input_slice, "input_shm"},
                                       {&output_slice, "output_shm"}}) {
      if (!slice->has_value()) continue;
      absl::Status backed = (*slice)->CheckStillBacked();
      if (!backed.ok()) return Prefixed(backed, field);
    }
    return absl::OkStatus();
  };
  GC_ASSIGN_OR_RETURN(ReduceOutput output, engine_->Reduce(*input, deliver));
  metrics_->SetStep(request.step());
  return ReduceResponseToProto(request, std::move(output));
}

absl::StatusOr<StallWatchdog::Watched> GradcompService::WatchStall(
    grpc::ServerContext* context, StallWatchdog::SinceFn since) {
  absl::StatusOr<StallWatchdog::Watched> watched =
      stall_watchdog_.Watch(std::move(since), [this, context] {
        metrics_->CountStalledStream();
        context->TryCancel();
      });
  if (!watched.ok()) metrics_->CountResourceExhausted("threads");
  return watched;
}

absl::StatusOr<StallWatchdog::Watched> GradcompService::WatchStall(
    grpc::ServerContext* context, ClientWait* wait) {
  return WatchStall(context, [wait] { return wait->Since(); });
}

grpc::Status GradcompService::Reduce(grpc::ServerContext* context,
                                     const v1::ReduceRequest* request,
                                     v1::ReduceResponse* response) {
  absl::StatusOr<v1::ReduceResponse> result =
      DoReduce(*request, ClientId(*context));
  if (!result.ok()) return ToGrpcStatus(result.status());
  *response = std::move(*result);
  return grpc::Status::OK;
}

grpc::Status GradcompService::ReduceStream(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<v1::ReduceStreamResponse, v1::ReduceRequest>*
        stream) {
  const ShmClient client = ClientId(*context);
  // gRPC allows one Read and one Write at a time on a stream: this thread
  // reads, and the outbox's writer writes what the workers queue there
  // (stream_outbox.h), so that a client that stops reading cannot hold the
  // workers every client shares.
  absl::StatusOr<std::unique_ptr<StreamOutbox>> started = StreamOutbox::Start(
      [stream](const v1::ReduceStreamResponse& answer) {
        return stream->Write(answer);
      },
      max_unwritten_bytes_);
  if (!started.ok()) {
    metrics_->CountResourceExhausted("threads");
    return ToGrpcStatus(started.status());
  }
  StreamOutbox& outbox = **started;
  // A client that stops taking its answers has its stream cancelled: the
  // blocked write fails, and the outbox drops what it queued.
  absl::StatusOr<StallWatchdog::Watched> watched =
      WatchStall(context, [&outbox] { return outbox.WritingSince(); });
  if (!watched.ok()) return ToGrpcStatus(watched.status());
  absl::Mutex mu;
  int pending = 0;
  // An answer goes to the outbox without a copy (a tensor sent alone holds
  // its average inline), with its reservation of the budget, which the
  // outbox keeps until the client has read it.
  const AnswerFn send = [&outbox](v1::ReduceStreamResponse response,
                                  std::shared_ptr<const void> hold) {
    outbox.Push(std::move(response), std::move(hold));
  };
  // Queues one tensor's reduce; `done` gets its answer, on a worker or, when
  // the memory budget or the bounded queue refuses it, here (the stream
  // goes on). A queued tensor's inline bytes and the estimate of its
  // working memory count against the budget while it waits.
  const WorkerPool::QueueId queue = stream_pool_.NewQueue();
  auto schedule = [this, &mu, &pending, &client, context, queue](
                      v1::ReduceRequest request,
                      std::shared_ptr<const BatchSpec> batch, AnswerFn done,
                      absl::Time memory_deadline) {
    const v1::ReduceRequest named = NamedPart(request);
    uint64_t working = 0;
    absl::StatusOr<MemoryBudget::Reservation> reserved =
        ReserveQueued(request, &working, memory_deadline);
    if (!reserved.ok()) {
      metrics_->CountReduce("unresolved", reserved.status().code());
      LeaveBatch(named, batch);
      done(StreamAnswer(named, Prefixed(reserved.status(), TensorLabel(named))),
           nullptr);
      return;
    }
    // std::function needs a copyable closure: the reservation is shared.
    auto held =
        std::make_shared<MemoryBudget::Reservation>(*std::move(reserved));
    {
      absl::MutexLock lock(&mu);
      ++pending;
    }
    // The answer of a tensor the pool refuses, or displaces for another
    // stream's (worker_pool.h).
    auto refuse = [this, &mu, &pending, named, batch,
                   done](WorkerPool::Refusal why) {
      std::string reason;
      if (why == WorkerPool::Refusal::kNoThread) {
        metrics_->CountResourceExhausted("threads");
        reason =
            "no thread could be started to reduce it (the system's thread "
            "limit); retry it, or lower --max_rpc_threads";
      } else {
        metrics_->CountResourceExhausted("stream_queue");
        reason = absl::StrCat(
            stream_pool_.max_queued(),
            " stream tensors are already waiting for a worker on this daemon "
            "(the queue's bound), and ",
            why == WorkerPool::Refusal::kDisplaced
                ? "this stream held the most of them: this tensor, its "
                  "newest, gave its place to another stream's"
                : "this stream would hold as many of them as the stream "
                  "holding the most",
            "; expected fewer tensors in flight, or retry this one");
      }
      metrics_->CountReduce("unresolved", absl::StatusCode::kResourceExhausted);
      LeaveBatch(named, batch);
      done(StreamAnswer(named, Prefixed(absl::ResourceExhaustedError(reason),
                                        TensorLabel(named))),
           nullptr);
      absl::MutexLock lock(&mu);
      --pending;
    };
    WorkerPool::Refusal refusal;
    const bool queued = stream_pool_.TrySchedule(
        [this, &mu, &pending, &client, context, held, working, done,
         request = std::move(request), batch]() mutable {
          // With one rank no peer waits for this tensor: once its client
          // has cancelled the stream, a tensor still queued is not reduced
          // (it would hold a worker for an answer nobody reads). With
          // peers it is, so that theirs complete (docs/clients.md).
          v1::ReduceStreamResponse answer;
          if (engine_->world_size() == 1 && context->IsCancelled()) {
            metrics_->CountReduce("unresolved", absl::StatusCode::kCancelled);
            answer = StreamAnswer(
                request,
                absl::CancelledError(absl::StrCat(
                    TensorLabel(request),
                    ": not reduced: its client cancelled the stream first")));
          } else {
            answer = StreamAnswer(
                request, DoReduce(request, client, held.get(), working, batch));
          }
          // The reduce's working copies are gone; its answer stays in the
          // budget until the client reads it, so that a client that does
          // not read cannot have the daemon hold unbudgeted answers. The
          // answer takes the task's hold: a task the pool destroys after
          // the stream ended must not keep the budget in use.
          held->ShrinkTo(answer.ByteSizeLong());
          done(std::move(answer), std::move(held));
          absl::MutexLock lock(&mu);
          --pending;
        },
        queue, [refuse] { refuse(WorkerPool::Refusal::kDisplaced); }, &refusal);
    if (!queued) refuse(refusal);
  };
  // A client whose answers pile up unread gets no more requests taken.
  v1::ReduceRequest request;
  uint64_t unparsed = 0;
  while (outbox.WaitForRoom() &&
         ReadParsed(*context, *stream, &request, &unparsed)) {
    if (request.parts_size() > 0) {
      ScheduleParts(request, send, schedule);
    } else {
      schedule(std::move(request), nullptr, send, absl::InfiniteFuture());
    }
    request = v1::ReduceRequest();
  }
  {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(
        +[](int* n) { return *n == 0; }, &pending));
  }
  if (!outbox.Close()) {
    return grpc::Status(
        grpc::StatusCode::CANCELLED,
        absl::StrCat("the client stopped reading results (none taken for ",
                     absl::FormatDuration(stall_watchdog_.timeout()),
                     ", --stream_stall_timeout, or the stream broke)"));
  }
  if (unparsed > 0) {
    for (uint64_t i = 0; i < unparsed; ++i) {
      metrics_->CountReduce("unresolved", absl::StatusCode::kInvalidArgument);
    }
    return ToGrpcStatus(absl::InvalidArgumentError(absl::StrCat(
        unparsed,
        " message(s) of this stream could not be parsed as a "
        "gradcomp.v1.ReduceRequest and got no answer (bad messages at the "
        "stream's end, or more than ",
        kMaxUnparsedInARow,
        " in a row, end it as a half-close would: the requests after them "
        "get no answer either)")));
  }
  return grpc::Status::OK;
}

void GradcompService::ScheduleParts(const v1::ReduceRequest& request,
                                    const AnswerFn& send,
                                    const ScheduleFn& schedule) {
  absl::StatusOr<SplitRequest> split = SplitParts(request);
  if (!split.ok()) {
    metrics_->CountReduce("unresolved", split.status().code());
    v1::ReduceStreamResponse refused;
    refused.set_request_id(request.request_id());
    refused.set_error_code(static_cast<int>(split.status().code()));
    refused.set_error_message(absl::StrCat("request ", request.request_id(),
                                           ": ", split.status().message()));
    send(std::move(refused), nullptr);
    return;
  }
  const absl::Time memory_deadline = absl::Now() + engine_->memory_wait();
  // The last part to finish sends every part's answer in one message.
  auto answer =
      std::make_shared<PartsAnswer>(request.request_id(), split->parts.size());
  for (size_t i = 0; i < split->parts.size(); ++i) {
    schedule(
        std::move(split->parts[i]), split->batch,
        [answer, i, send](v1::ReduceStreamResponse part,
                          std::shared_ptr<const void> hold) {
          if (!answer->Set(i, std::move(part), std::move(hold))) return;
          auto [whole, holds] = answer->Take();
          send(std::move(whole), std::move(holds));
        },
        memory_deadline);
  }
}

grpc::Status GradcompService::GetInfo(grpc::ServerContext* /*context*/,
                                      const v1::GetInfoRequest* /*request*/,
                                      v1::GetInfoResponse* response) {
  response->set_version(kVersion);
  response->set_wire_format_version(codecs::kWireVersion);
  for (const codecs::CodecInfo& info : engine_->registry().List()) {
    v1::CodecDescription* codec = response->add_codecs();
    codec->set_name(info.name);
    codec->set_wire_id(static_cast<uint32_t>(info.id));
    codec->set_family(info.family);
    codec->set_summable(info.summable);
    codec->set_unbiased(info.unbiased);
    codec->set_stateful(info.stateful);
    codec->set_rounds(static_cast<uint32_t>(info.rounds));
    codec->set_shardable(info.shardable);
    for (const std::string& param : info.params) codec->add_params(param);
  }
  response->set_world_size(static_cast<uint32_t>(engine_->world_size()));
  response->set_rank(static_cast<uint32_t>(engine_->rank()));
  response->set_device(ComputeDevice());
  for (const std::string& transport : settings_.transports) {
    response->add_transports(transport);
  }
  std::shared_ptr<const Engine::PolicySnapshot> policy = engine_->policy();
  response->set_policy_hash(policy->hash);
  *response->mutable_policy() = PolicyToProto(policy->policy);
  if (policy->from_step.has_value()) {
    response->set_policy_from_step(*policy->from_step);
  }
  response->set_config_json(settings_.config_json);
  response->mutable_flags()->insert(settings_.flags.begin(),
                                    settings_.flags.end());
  return grpc::Status::OK;
}

grpc::Status GradcompService::GetPolicy(grpc::ServerContext* /*context*/,
                                        const v1::GetPolicyRequest* /*request*/,
                                        v1::GetPolicyResponse* response) {
  std::shared_ptr<const Engine::PolicySnapshot> snapshot = engine_->policy();
  *response->mutable_policy() = PolicyToProto(snapshot->policy);
  response->set_hash(snapshot->hash);
  if (snapshot->from_step.has_value()) {
    response->set_from_step(*snapshot->from_step);
  }
  return grpc::Status::OK;
}

grpc::Status GradcompService::SetPolicy(grpc::ServerContext* /*context*/,
                                        const v1::SetPolicyRequest* request,
                                        v1::SetPolicyResponse* response) {
  absl::StatusOr<Policy> policy = PolicyFromProto(request->policy());
  if (!policy.ok()) return ToGrpcStatus(policy.status());
  absl::StatusOr<std::string> hash = engine_->SetPolicy(
      *std::move(policy), request->has_from_step()
                              ? std::optional<int64_t>(request->from_step())
                              : std::nullopt);
  if (!hash.ok()) return ToGrpcStatus(hash.status());
  response->set_hash(*hash);
  if (request->has_from_step()) response->set_from_step(request->from_step());
  return grpc::Status::OK;
}

absl::StatusOr<std::string> GradcompService::ShmCaller(
    const grpc::ServerContext& context) const {
  if (shm_ == nullptr) return absl::FailedPreconditionError(kClientShmOff);
  ShmClient client = ClientId(context);
  if (!client.has_value()) return UnidentifiedClient();
  return *std::move(client);
}

grpc::Status GradcompService::RegisterSystemSharedMemory(
    grpc::ServerContext* context,
    const v1::RegisterSystemSharedMemoryRequest* request,
    v1::RegisterSystemSharedMemoryResponse* /*response*/) {
  absl::StatusOr<std::string> client = ShmCaller(*context);
  if (!client.ok()) return ToGrpcStatus(client.status());
  return ToGrpcStatus(
      shm_->RegisterSystem(*client, request->name(), request->shm_key(),
                           request->offset(), request->byte_size()));
}

grpc::Status GradcompService::RegisterCudaSharedMemory(
    grpc::ServerContext* context,
    const v1::RegisterCudaSharedMemoryRequest* request,
    v1::RegisterCudaSharedMemoryResponse* /*response*/) {
  absl::StatusOr<std::string> client = ShmCaller(*context);
  if (!client.ok()) return ToGrpcStatus(client.status());
  return ToGrpcStatus(shm_->RegisterCuda(
      *client, request->name(), request->raw_handle(), request->device_id(),
      request->byte_size(), request->lock_key()));
}

grpc::Status GradcompService::UnregisterSharedMemory(
    grpc::ServerContext* context,
    const v1::UnregisterSharedMemoryRequest* request,
    v1::UnregisterSharedMemoryResponse* /*response*/) {
  absl::StatusOr<std::string> client = ShmCaller(*context);
  if (!client.ok()) return ToGrpcStatus(client.status());
  return ToGrpcStatus(shm_->Unregister(*client, request->name()));
}

grpc::Status GradcompService::SharedMemoryStatus(
    grpc::ServerContext* context, const v1::SharedMemoryStatusRequest* request,
    v1::SharedMemoryStatusResponse* response) {
  absl::StatusOr<std::string> client = ShmCaller(*context);
  if (!client.ok()) return ToGrpcStatus(client.status());
  absl::StatusOr<std::vector<SharedMemoryRegionInfo>> regions =
      shm_->Status(*client, request->name());
  if (!regions.ok()) return ToGrpcStatus(regions.status());
  for (const SharedMemoryRegionInfo& info : *regions) {
    v1::SharedMemoryRegionStatus* region = response->add_regions();
    region->set_name(info.name);
    region->set_kind(info.kind);
    region->set_byte_size(info.byte_size);
    region->set_key(info.key);
    region->set_in_flight(info.in_flight);
    region->set_lock_key(info.lock_key);
  }
  return grpc::Status::OK;
}

grpc::Status GradcompService::DeclareTensors(
    grpc::ServerContext* /*context*/, const v1::DeclareTensorsRequest* request,
    v1::DeclareTensorsResponse* response) {
  std::vector<TensorDecl> decls;
  decls.reserve(request->tensors_size());
  for (const v1::TensorDeclaration& t : request->tensors()) {
    decls.push_back({t.name(), static_cast<DType>(t.dtype()),
                     std::vector<int64_t>(t.shape().begin(), t.shape().end())});
  }
  absl::StatusOr<std::string> hash =
      engine_->DeclareTensors(request->job(), request->generation(), decls);
  if (!hash.ok()) {
    return ToGrpcStatus(absl::Status(
        hash.status().code(),
        absl::StrCat("job '", request->job(), "': ", hash.status().message())));
  }
  response->set_list_hash(std::move(*hash));
  response->set_world_size(engine_->world_size());
  return grpc::Status::OK;
}

grpc::Status GradcompService::ExportState(grpc::ServerContext* /*context*/,
                                          const v1::ExportStateRequest* request,
                                          v1::ExportStateResponse* response) {
  absl::StatusOr<std::string> blob = engine_->ExportState(request->job());
  if (!blob.ok()) return ToGrpcStatus(blob.status());
  response->set_state(std::move(*blob));
  return grpc::Status::OK;
}

grpc::Status GradcompService::ImportState(
    grpc::ServerContext* /*context*/, const v1::ImportStateRequest* request,
    v1::ImportStateResponse* /*response*/) {
  return ToGrpcStatus(engine_->ImportState(request->job(), request->state()));
}

grpc::Status GradcompService::ExportStateStream(
    grpc::ServerContext* context, const v1::ExportStateRequest* request,
    grpc::ServerWriter<v1::ExportStateResponse>* writer) {
  absl::StatusOr<std::string> blob = engine_->ExportState(request->job());
  if (!blob.ok()) return ToGrpcStatus(blob.status());
  ClientWait wait;
  absl::StatusOr<StallWatchdog::Watched> watched = WatchStall(context, &wait);
  if (!watched.ok()) return ToGrpcStatus(watched.status());
  const absl::string_view state = *blob;
  size_t sent = 0;
  do {
    v1::ExportStateResponse piece;
    piece.set_state(std::string(state.substr(sent, kStatePieceBytes)));
    sent += piece.state().size();
    wait.Begin();
    const bool written = writer->Write(piece);
    wait.End();
    if (!written) {
      return grpc::Status(grpc::StatusCode::CANCELLED,
                          "the client went away, or took no piece for "
                          "--stream_stall_timeout, before the state was sent");
    }
  } while (sent < state.size());
  return grpc::Status::OK;
}

grpc::Status GradcompService::ImportStateStream(
    grpc::ServerContext* context,
    grpc::ServerReader<v1::ImportStateRequest>* reader,
    v1::ImportStateResponse* /*response*/) {
  // Progress is bytes: a client that sends nothing, or only empty pieces,
  // for the stall timeout is cancelled.
  ClientWait last_bytes;
  last_bytes.Begin();
  absl::StatusOr<StallWatchdog::Watched> watched =
      WatchStall(context, &last_bytes);
  if (!watched.ok()) return ToGrpcStatus(watched.status());
  std::optional<std::string> job;
  uint64_t declared = 0;
  std::string blob;
  // The blob's bytes as they come, until the import returns: it and the
  // state it makes are both in memory then.
  MemoryBudget::Reservation held;
  uint64_t unparsed = 0;
  v1::ImportStateRequest piece;
  while (ReadParsed(*context, *reader, &piece, &unparsed) && unparsed == 0) {
    if (!job.has_value()) {
      if (piece.job().empty()) {
        return ToGrpcStatus(absl::InvalidArgumentError(
            "ImportStateStream: the first message names no job; expected the "
            "job whose state the stream carries"));
      }
      job = piece.job();
      declared = piece.state_bytes();
      if (declared > engine_->memory_budget_bytes()) {
        return ToGrpcStatus(absl::ResourceExhaustedError(absl::StrCat(
            "ImportStateStream of job '", *job, "': the blob's ", declared,
            " bytes (state_bytes) are more than the whole memory budget, ",
            engine_->memory_budget_bytes(),
            " bytes; expected a larger --memory_budget_bytes (nothing "
            "imported)")));
      }
      // Empty, of the budget: it grows with the pieces.
      absl::StatusOr<MemoryBudget::Reservation> none =
          engine_->ReserveInput(0, "");
      if (!none.ok()) return ToGrpcStatus(none.status());
      held = *std::move(none);
    } else if (!piece.job().empty() && piece.job() != *job) {
      return ToGrpcStatus(absl::InvalidArgumentError(
          absl::StrCat("ImportStateStream: a message names job '", piece.job(),
                       "' after the first named '", *job,
                       "'; expected one job per stream (nothing imported)")));
    }
    if (piece.state().size() > declared - blob.size()) {
      return ToGrpcStatus(absl::InvalidArgumentError(
          absl::StrCat("ImportStateStream of job '", *job,
                       "': the pieces bring more than the ", declared,
                       " bytes the first message's state_bytes declared "
                       "(nothing imported)")));
    }
    if (piece.state().empty()) continue;
    const absl::Status grown = held.GrowTo(
        blob.size() + piece.state().size(),
        absl::StrCat("the state blob of job '", *job, "' being imported"),
        engine_->memory_wait());
    if (!grown.ok()) {
      return ToGrpcStatus(absl::Status(
          grown.code(), absl::StrCat(grown.message(), "; nothing imported")));
    }
    blob.append(piece.state());
    last_bytes.Begin();
  }
  if (context->IsCancelled()) {
    return grpc::Status(grpc::StatusCode::CANCELLED,
                        "the stream ended before the client finished it (it "
                        "cancelled, went away, or sent no bytes for "
                        "--stream_stall_timeout); nothing imported");
  }
  if (unparsed > 0) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        "ImportStateStream: a message could not be parsed as a "
        "gradcomp.v1.ImportStateRequest; nothing imported"));
  }
  if (!job.has_value()) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        "ImportStateStream: no message; expected the job and its state"));
  }
  if (blob.size() != declared) {
    return ToGrpcStatus(absl::InvalidArgumentError(absl::StrCat(
        "ImportStateStream of job '", *job, "': the stream ended after ",
        blob.size(), " of the ", declared,
        " bytes the first message's state_bytes declared (a message that "
        "cannot be parsed ends it too); nothing imported")));
  }
  return ToGrpcStatus(engine_->ImportState(*job, blob));
}

grpc::Status GradcompService::ReleaseJob(grpc::ServerContext* /*context*/,
                                         const v1::ReleaseJobRequest* request,
                                         v1::ReleaseJobResponse* response) {
  absl::StatusOr<ReleasedJob> released = engine_->ReleaseJob(request->job());
  if (!released.ok()) return ToGrpcStatus(released.status());
  response->set_tensors(released->tensors);
  response->set_state_bytes(released->state_bytes);
  return grpc::Status::OK;
}

}  // namespace gradcomp::service
