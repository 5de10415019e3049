// The gRPC shell of the gradcomp.v1.Gradcomp API: converts protos to core
// types, calls the Engine, and converts its absl::Status back through
// ToGrpcStatus. No business logic lives here.
//
//   GradcompService service(engine.get(), &metrics, StreamOptions());
//   GC_ASSIGN_OR_RETURN(auto server, StartGrpcServer(listen, &service));
#ifndef GRADCOMP_SERVICE_API_GRADCOMP_SERVICE_H_
#define GRADCOMP_SERVICE_API_GRADCOMP_SERVICE_H_

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gradcomp/v1/gradcomp.grpc.pb.h"
#include "gradcomp/v1/gradcomp.pb.h"
#include "grpcpp/grpcpp.h"
#include "service/api/stall_watchdog.h"
#include "service/api/worker_pool.h"
#include "service/engine/engine.h"
#include "service/memory/shared_memory_registry.h"
#include "service/metrics/metrics.h"

namespace gradcomp::service {

namespace v1 = ::gradcomp::v1;

// What GetInfo reports beyond the engine's own state: how the daemon was
// configured and how it reaches its peers.
struct DaemonSettings {
  std::string config_json;  // ConfigToJson of the effective DaemonConfig
  std::map<std::string, std::string> flags;  // flag-only settings
  std::vector<std::string> transports = {"local"};
};

// How streaming calls are served.
struct StreamOptions {
  // The pool that reduces the tensors of every ReduceStream; a tensor
  // beyond its queue is answered RESOURCE_EXHAUSTED (worker_pool.h).
  WorkerPool::Limits pool;
  // Unread answers beyond which a ReduceStream reads no more requests
  // (StreamOutbox::WaitForRoom): room for a reading client's answers to
  // flow. The answers of requests already read still come, bounded by the
  // memory budget only. main.cc: 256 MiB, or a sixteenth of the budget
  // when that is less.
  uint64_t max_unwritten_bytes = uint64_t{256} << 20;
  // A stream whose client makes no progress for this long is cancelled:
  // a ReduceStream or ExportStateStream whose client takes nothing (alive
  // but not reading), an ImportStateStream whose client sends nothing. What
  // it held in the memory budget is freed.
  absl::Duration stall_timeout = absl::Minutes(2);
};

class GradcompService final : public v1::Gradcomp::Service {
 public:
  // `streams` says how ReduceStreams are served. `engine` and `metrics`
  // must outlive the service.
  // `shm` (may be null: client shared memory off, --allow_client_shm
  // unset) serves the shared-memory RPCs and Reduce slices.
  GradcompService(Engine* engine, Metrics* metrics, StreamOptions streams,
                  DaemonSettings settings = {},
                  SharedMemoryRegistry* shm = nullptr);

  grpc::Status Reduce(grpc::ServerContext* context,
                      const v1::ReduceRequest* request,
                      v1::ReduceResponse* response) override;
  // Results are written in completion order; a failed tensor answers with
  // error_code/error_message and the stream goes on.
  grpc::Status ReduceStream(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::ReduceStreamResponse, v1::ReduceRequest>*
          stream) override;
  grpc::Status GetInfo(grpc::ServerContext* context,
                       const v1::GetInfoRequest* request,
                       v1::GetInfoResponse* response) override;
  grpc::Status GetPolicy(grpc::ServerContext* context,
                         const v1::GetPolicyRequest* request,
                         v1::GetPolicyResponse* response) override;
  grpc::Status SetPolicy(grpc::ServerContext* context,
                         const v1::SetPolicyRequest* request,
                         v1::SetPolicyResponse* response) override;
  grpc::Status RegisterSystemSharedMemory(
      grpc::ServerContext* context,
      const v1::RegisterSystemSharedMemoryRequest* request,
      v1::RegisterSystemSharedMemoryResponse* response) override;
  grpc::Status RegisterCudaSharedMemory(
      grpc::ServerContext* context,
      const v1::RegisterCudaSharedMemoryRequest* request,
      v1::RegisterCudaSharedMemoryResponse* response) override;
  grpc::Status UnregisterSharedMemory(
      grpc::ServerContext* context,
      const v1::UnregisterSharedMemoryRequest* request,
      v1::UnregisterSharedMemoryResponse* response) override;
  grpc::Status SharedMemoryStatus(
      grpc::ServerContext* context,
      const v1::SharedMemoryStatusRequest* request,
      v1::SharedMemoryStatusResponse* response) override;
  grpc::Status DeclareTensors(grpc::ServerContext* context,
                              const v1::DeclareTensorsRequest* request,
                              v1::DeclareTensorsResponse* response) override;
  grpc::Status ExportState(grpc::ServerContext* context,
                           const v1::ExportStateRequest* request,
                           v1::ExportStateResponse* response) override;
  grpc::Status ImportState(grpc::ServerContext* context,
                           const v1::ImportStateRequest* request,
                           v1::ImportStateResponse* response) override;
  // The state in pieces of kStatePieceBytes, for blobs over the client
  // API's message cap.
  grpc::Status ExportStateStream(
      grpc::ServerContext* context, const v1::ExportStateRequest* request,
      grpc::ServerWriter<v1::ExportStateResponse>* writer) override;
  // The pieces are held in the memory budget until the stream ends; then
  // the whole blob is imported, or nothing.
  grpc::Status ImportStateStream(
      grpc::ServerContext* context,
      grpc::ServerReader<v1::ImportStateRequest>* reader,
      v1::ImportStateResponse* response) override;

  // The bytes of state in one ExportStateStream message: far under the
  // smallest client message cap (max_tensor_bytes + 1 MiB).
  static constexpr size_t kStatePieceBytes = size_t{512} << 10;
  grpc::Status ReleaseJob(grpc::ServerContext* context,
                          const v1::ReleaseJobRequest* request,
                          v1::ReleaseJobResponse* response) override;

 private:
  // Who owns shared-memory regions (ClientId of a call); nullopt for a
  // caller that cannot be told apart from others, which gets no shared
  // memory.
  using ShmClient = std::optional<std::string>;

  // The caller of a shared-memory RPC, by whom its regions go: an error
  // when client shared memory is off, or for a caller ClientId cannot tell
  // apart from the others on its socket.
  absl::StatusOr<std::string> ShmCaller(
      const grpc::ServerContext& context) const;

  // One Reduce in core terms for `client` (ClientId of the call); the
  // status is what the client sees. `held` holds the request's inline
  // bytes in the memory budget and `held_working` bytes of its working
  // memory (ReserveQueued); null: the engine reserves them all, in one
  // piece.
  // `batch`: the batch of a request's parts (SplitRequest), for a part.
  absl::StatusOr<v1::ReduceResponse> DoReduce(
      const v1::ReduceRequest& request, const ShmClient& client,
      MemoryBudget::Reservation* held = nullptr, uint64_t held_working = 0,
      std::shared_ptr<const BatchSpec> batch = nullptr);
  // Queues one ReduceStream tensor's reduce (with its batch when it is a
  // part: DoReduce); `done` gets its answer, from a worker or, when the
  // memory budget or the queue refuses it, at once.
  // An answer, and what must be kept until the client has read it (the
  // budget's reservation of its bytes; null for none).
  using AnswerFn = std::function<void(v1::ReduceStreamResponse,
                                      std::shared_ptr<const void>)>;
  // `memory_deadline`: how long the tensor may wait for room in the memory
  // budget (at most --memory_wait).
  using ScheduleFn =
      std::function<void(v1::ReduceRequest, std::shared_ptr<const BatchSpec>,
                         AnswerFn, absl::Time memory_deadline)>;
  // A ReduceStream request with parts: each part scheduled as a tensor of
  // its own, and every part's answer sent with `send` in one message once
  // the last is in; a request SplitParts refuses is answered with its error.
  // The parts share the request's --memory_wait: a full budget refuses a
  // request of 128 parts after one wait, not 128 of them.
  void ScheduleParts(const v1::ReduceRequest& request, const AnswerFn& send,
                     const ScheduleFn& schedule);
  // Reserves, for a stream's request that may wait in the queue, its
  // inline input and the estimate of its working memory (set in
  // `*working`) in one piece of the engine's memory budget: a request that
  // held only its input would keep the workers from the room they grow
  // into.
  absl::StatusOr<MemoryBudget::Reservation> ReserveQueued(
      const v1::ReduceRequest& request, uint64_t* working,
      absl::Time memory_deadline);
  // `request` was refused before the engine saw it: if it is a member of a
  // batch (its own, or `batch` as a part's), the other members go on
  // without it rather than wait for it until the batch's deadline.
  void LeaveBatch(const v1::ReduceRequest& request,
                  const std::shared_ptr<const BatchSpec>& batch);
  // Host copies of a request's slices of CUDA regions: the engine runs on
  // the CPU, so a CUDA input is copied to the host before the reduce and a
  // CUDA output back after it (docs/gpu.md, "CUDA IPC"). Counted against
  // the memory budget while the request runs.
  struct HostStaging {
    std::vector<char> input;
    std::vector<char> output;
    std::vector<MemoryBudget::Reservation> reservations;
    // Input and output slices on one GPU: the engine reduces them there
    // (ReduceInput::device), and nothing above is used.
    DeviceTensor device;
  };
  // The engine input of `request` (and `batch`, as DoReduce's), with its
  // shared-memory slices acquired into `input_slice` / `output_slice`,
  // which the caller holds until the reduce returns.
  absl::StatusOr<ReduceInput> ResolveInput(
      const v1::ReduceRequest& request, const ShmClient& client,
      std::shared_ptr<const BatchSpec> batch,
      std::optional<SharedMemorySlice>* input_slice,
      std::optional<SharedMemorySlice>* output_slice, HostStaging* staging);
  // `slice`'s bytes: a system slice's own, a CUDA slice's in `host`,
  // reserved in the memory budget (and copied from the device if `copy_in`).
  absl::StatusOr<absl::Span<char>> HostBytes(const SharedMemorySlice& slice,
                                             bool copy_in,
                                             std::vector<char>* host,
                                             HostStaging* staging);
  absl::StatusOr<SharedMemorySlice> AcquireSlice(
      const ShmClient& client, const v1::SharedMemorySlice& slice,
      absl::string_view field);

  // When a streaming call's current wait on its client began (a Write the
  // client does not take, a Read it sends nothing for), for WatchStall.
  class ClientWait {
   public:
    void Begin() ABSL_LOCKS_EXCLUDED(mu_);
    void End() ABSL_LOCKS_EXCLUDED(mu_);
    std::optional<StallWatchdog::Clock::time_point> Since() const
        ABSL_LOCKS_EXCLUDED(mu_);

   private:
    mutable absl::Mutex mu_;
    std::optional<StallWatchdog::Clock::time_point> since_ ABSL_GUARDED_BY(mu_);
  };
  // Cancels `context`'s call once `since` (or `wait`) names a wait older
  // than the stall timeout, counting it; until the Watched goes. An error
  // (counted) when the watchdog's thread cannot start.
  absl::StatusOr<StallWatchdog::Watched> WatchStall(
      grpc::ServerContext* context, StallWatchdog::SinceFn since);
  absl::StatusOr<StallWatchdog::Watched> WatchStall(
      grpc::ServerContext* context, ClientWait* wait);

  Engine* const engine_;
  Metrics* const metrics_;
  const DaemonSettings settings_;
  SharedMemoryRegistry* const shm_;
  const uint64_t max_unwritten_bytes_;
  // Cancels the streams whose client stopped reading; destroyed after the
  // pool, whose tasks end the streams it watches.
  StallWatchdog stall_watchdog_;
  WorkerPool stream_pool_;
};

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_API_GRADCOMP_SERVICE_H_
