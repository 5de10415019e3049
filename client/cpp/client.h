// C++ client of gradcompd: reduce tensors, read the daemon's info and policy.
// Every RPC error comes back as an absl::Status with the gRPC code kept and
// the RPC and target named in the message.
//
//   GC_ASSIGN_OR_RETURN(std::unique_ptr<Client> client,
//                       Client::Connect(kDefaultTarget));
//   v1::CodecSpec topk;
//   topk.set_name("topk");
//   (*topk.mutable_params())["ratio"] = "0.01";
//   GC_ASSIGN_OR_RETURN(Float32ReduceResult r,
//       client->Reduce("job", "fc.weight", step, grad, {256, 784}, topk));
//   // r.values: the average over all workers; r.stats: bytes, error, timings.
#ifndef GRADCOMP_CLIENT_CPP_CLIENT_H_
#define GRADCOMP_CLIENT_CPP_CLIENT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "gradcomp/v1/gradcomp.grpc.pb.h"
#include "gradcomp/v1/gradcomp.pb.h"
#include "grpcpp/grpcpp.h"

namespace gradcomp::client {

struct ClientOptions {
  // Deadline of each RPC. A Reduce waits for every worker of the job, so this
  // bounds how long one straggler can hold a caller. The default is longer
  // than the daemon's own deadlines at their defaults (60 s per collective
  // round, a reduce of PowerSGD has two; 10 s of --memory_wait), so that a
  // stalled reduce ends with the daemon's error naming the missing ranks,
  // not a bare DEADLINE_EXCEEDED. A deadline that passes here does not stop
  // the reduce in the daemon: the other ranks may still use this rank's
  // input for that step.
  absl::Duration rpc_timeout = absl::Seconds(300);
  // Sent as the "gradcomp-client-id" metadata of every call: the daemon's
  // shared-memory regions belong to it. Empty: "<hostname>.<pid>.<random>".
  // Printable ASCII, at most kMaxClientIdBytes.
  std::string client_id;
  // Sent as "authorization: Bearer <token>" on every call, for a daemon on
  // TCP with --client_token_file. Empty: $GRADCOMP_TOKEN if set, else none
  // (a unix-socket daemon needs none). Surrounding whitespace is trimmed,
  // as the daemon trims its token file (a secret's trailing newline).
  std::string token;
};

// Where gradcompd listens by default (its --listen), and so where clients
// connect when no target is given.
inline constexpr char kDefaultTarget[] = "unix:/run/gradcomp/gradcomp.sock";

// The longest ClientOptions::client_id: it travels in every call's metadata,
// which gRPC caps at 8 KiB by default.
inline constexpr size_t kMaxClientIdBytes = 1024;

// The most tensor (or state blob) bytes a call sends inline: a gRPC message
// is a protobuf, at most 2 GiB - 1, and the request's other fields need
// room. Larger tensors go through shared memory (RegisterShm, ReduceShm).
inline constexpr uint64_t kMaxInlineBytes = (uint64_t{1} << 31) - (1 << 20);

// A slice of a registered shared-memory region.
struct ShmSlice {
  std::string region;
  uint64_t offset = 0;
  uint64_t byte_size = 0;
};

// One tensor of a bucket (Client::ReduceShmBucket): its name, its shape and
// its byte offset from the start of both the input and the output slice.
struct ShmPart {
  std::string tensor;
  std::vector<int64_t> shape;
  uint64_t offset = 0;
};

// The result of a Reduce in the input's dtype.
struct ReduceResult {
  v1::DType dtype = v1::DTYPE_UNSPECIFIED;
  std::string data;  // little-endian, C order, same shape as the input
  v1::ReduceStats stats;
};

struct Float32ReduceResult {
  std::vector<float> values;
  v1::ReduceStats stats;
};

// The one place where gRPC errors become absl errors: the code is kept and
// the message says which RPC on which target failed.
absl::Status FromGrpcStatus(const grpc::Status& status, absl::string_view rpc,
                            absl::string_view target);

// Bytes per element of `dtype`; 0 for DTYPE_UNSPECIFIED or unknown values.
size_t DTypeSize(v1::DType dtype);

// Thread-safe: a Client is read-only after Connect and gRPC stubs may be
// called from any thread, so one Client may serve every thread of a trainer
// at once (a batch's members, below, must be reduced concurrently).
class Client {
 public:
  // `target` is "host:port" or "unix:/path" (a path of at most 107 bytes,
  // what a unix socket address holds). Connecting is lazy: an absent daemon
  // shows up as Unavailable on the first RPC (see WaitForReady).
  static absl::StatusOr<std::unique_ptr<Client>> Connect(
      const std::string& target, ClientOptions options = {});

  // Blocks until the channel is connected or `timeout` passes.
  absl::Status WaitForReady(absl::Duration timeout);

  // Blocks until the daemon's health (grpc.health.v1, the service the
  // kubelet probes) is SERVING: it listens, and every peer was connected
  // both ways at its start-up. A reduce sent before then waits for the
  // missing peers until --collective_timeout and fails, so a trainer started
  // beside its sidecar calls this first. Health stays SERVING while the
  // daemon runs: this does not tell whether a peer has gone since.
  // Unavailable, with the last status seen, if not SERVING by `timeout`.
  absl::Status WaitServing(absl::Duration timeout);

  // Reduces a float32 tensor; `codec` unset lets the daemon's policy decide.
  // `batch` set: the tensor's rounds travel in one collective with the
  // batch's other members (gradcomp.proto ReduceBatch), which must be
  // reduced concurrently, from other threads or a stream.
  absl::StatusOr<Float32ReduceResult> Reduce(
      const std::string& job, const std::string& tensor, int64_t step,
      absl::Span<const float> values, absl::Span<const int64_t> shape,
      const std::optional<v1::CodecSpec>& codec = std::nullopt,
      const std::optional<v1::ReduceBatch>& batch = std::nullopt);

  // Reduces raw little-endian bytes of `dtype` (float16/bfloat16/float32/
  // float64). The length must be numel(shape) * DTypeSize(dtype).
  // The daemon, not the client, checks the length, shape, dtype, job and
  // tensor names (here and in every Reduce below): it refuses them with
  // InvalidArgument, naming what it expected. A reply that does not match
  // the request (its dtype or size) is Internal.
  absl::StatusOr<ReduceResult> ReduceBytes(
      const std::string& job, const std::string& tensor, int64_t step,
      v1::DType dtype, std::string data, absl::Span<const int64_t> shape,
      const std::optional<v1::CodecSpec>& codec = std::nullopt,
      const std::optional<v1::ReduceBatch>& batch = std::nullopt);

  // Gossip mode (docs/gossip.md): returns `values` mixed with the job's
  // neighbouring workers' on `gossip`'s topology instead of the average.
  // Every worker of the job must name the same spec. `consensus_distance`
  // > 0 is exported as gradcomp_gossip_consensus_distance{gradcomp_job}. An
  // empty topology, or a negative or non-finite diffusion or distance, is an
  // InvalidArgument before anything is sent.
  absl::StatusOr<Float32ReduceResult> Gossip(
      const std::string& job, const std::string& tensor, int64_t step,
      absl::Span<const float> values, absl::Span<const int64_t> shape,
      const v1::GossipSpec& gossip, double consensus_distance = 0);

  // Shared memory (the daemon needs --allow_client_shm; the region comes
  // from ShmRegion, shm_region.h). `name` must be unique on the daemon.
  absl::Status RegisterShm(const std::string& name, const std::string& shm_key,
                           uint64_t offset, uint64_t byte_size);
  // Empty `name`: every region of this client.
  absl::Status UnregisterShm(const std::string& name);
  absl::StatusOr<v1::SharedMemoryStatusResponse> ShmStatus(
      const std::string& name = "");
  // Reduces the tensor in `input` (numel(shape) * DTypeSize(dtype) bytes of
  // a registered region) and writes the average into `output`, both on the
  // daemon's side of the mapping: no tensor bytes cross gRPC. The slices
  // must not overlap.
  absl::StatusOr<v1::ReduceStats> ReduceShm(
      const std::string& job, const std::string& tensor, int64_t step,
      v1::DType dtype, absl::Span<const int64_t> shape, const ShmSlice& input,
      const ShmSlice& output,
      const std::optional<v1::CodecSpec>& codec = std::nullopt,
      const std::optional<v1::ReduceBatch>& batch = std::nullopt);

  // ReduceShm for a bucket: tensors laid out in `input` and copied alike
  // into `output` (each part at the same offset in both), sent as one
  // ReduceStream request with parts instead of a Reduce per tensor, so one
  // message goes each way (docs/clients.md, "Parts"). Every part gets the
  // same dtype, codec and batch. The result holds each part's stats or its
  // own error, in the parts' order: a part fails alone. A request the daemon
  // refuses whole (parts that overlap or leave the slices, a bad batch,
  // more than 128 parts) is the returned status. A reply that cannot answer
  // this request (more than one message, part results whose request_id is
  // not their index) is Internal.
  absl::StatusOr<std::vector<absl::StatusOr<v1::ReduceStats>>> ReduceShmBucket(
      const std::string& job, int64_t step, v1::DType dtype,
      absl::Span<const ShmPart> parts, const ShmSlice& input,
      const ShmSlice& output,
      const std::optional<v1::CodecSpec>& codec = std::nullopt,
      const std::optional<v1::ReduceBatch>& batch = std::nullopt);

  absl::StatusOr<v1::GetInfoResponse> GetInfo();
  absl::StatusOr<v1::GetPolicyResponse> GetPolicy();
  // Returns the new policy's hash. With `from_step` it decides steps >=
  // *from_step only (SetPolicyRequest.from_step): sent to every rank, all
  // switch at that step.
  absl::StatusOr<std::string> SetPolicy(
      const v1::Policy& policy,
      std::optional<int64_t> from_step = std::nullopt);

  // Declares the job's tensor list (every worker must declare the same one;
  // the daemons compare them). Returns the list's hash.
  absl::StatusOr<v1::DeclareTensorsResponse> DeclareTensors(
      const v1::DeclareTensorsRequest& request);

  // The daemon's codec state of `job` (residuals, momenta, warm starts) as
  // an opaque blob for a checkpoint, and its restore; a bad blob is
  // InvalidArgument and imports nothing. Both go in pieces of
  // kStatePieceBytes (ExportStateStream, ImportStateStream), so a blob may
  // be larger than a message.
  absl::StatusOr<std::string> ExportState(const std::string& job);
  absl::Status ImportState(const std::string& job, std::string state);
  static constexpr size_t kStatePieceBytes = size_t{512} << 10;

  // Ends `job` on this daemon once its last reduce here has returned
  // (gradcomp.proto ReleaseJob): its codec state, tensor list and gossip
  // state are freed; a later reduce of the job starts afresh.
  absl::StatusOr<v1::ReleaseJobResponse> ReleaseJob(const std::string& job);

  const std::string& target() const { return target_; }
  const std::string& client_id() const { return options_.client_id; }

 private:
  Client(std::string target, ClientOptions options,
         std::shared_ptr<grpc::Channel> channel);

  // A context with the RPC deadline set.
  std::unique_ptr<grpc::ClientContext> NewContext() const;
  // Sends `request` (with inline data) and checks the result's size.
  absl::StatusOr<ReduceResult> ReduceInline(v1::ReduceRequest request);

  std::string target_;
  ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Gradcomp::Stub> stub_;
};

}  // namespace gradcomp::client

#endif  // GRADCOMP_CLIENT_CPP_CLIENT_H_
