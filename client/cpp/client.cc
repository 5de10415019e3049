#include "client/cpp/client.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "base/bearer_token.h"
#include "base/status_macros.h"
#include "base/unix_socket_path.h"
#include "grpcpp/impl/client_unary_call.h"
#include "grpcpp/impl/rpc_method.h"
#include "grpcpp/support/byte_buffer.h"

namespace gradcomp::client {
namespace {

// The error a ReduceStream answer (a request's, or one part's) carries, as
// FromGrpcStatus words it; OK when it has none.
absl::Status AnswerStatus(const v1::ReduceStreamResponse& answer,
                          absl::string_view target) {
  return FromGrpcStatus(
      grpc::Status(static_cast<grpc::StatusCode>(answer.error_code()),
                   answer.error_message()),
      "ReduceStream", target);
}

v1::SharedMemorySlice SliceProto(const ShmSlice& slice) {
  v1::SharedMemorySlice proto;
  proto.set_region(slice.region);
  proto.set_offset(slice.offset);
  proto.set_byte_size(slice.byte_size);
  return proto;
}

// "float16" for DTYPE_FLOAT16: how a message names a dtype.
std::string DTypeLabel(v1::DType dtype) {
  std::string label = v1::DType_Name(dtype);
  if (label.empty()) return absl::StrCat("dtype ", static_cast<int>(dtype));
  absl::string_view name = label;
  absl::ConsumePrefix(&name, "DTYPE_");
  return absl::AsciiStrToLower(name);
}

// The request a part's answer names: the part's index, which the daemon
// puts in the error's request_id or in the result's.
uint64_t PartAnswerId(const v1::ReduceStreamResponse& part) {
  return part.error_code() != 0 ? part.request_id()
                                : part.result().request_id();
}

// A float32 result of `n` values (the dtype and size ReduceInline checked).
Float32ReduceResult ToFloat32(ReduceResult raw, size_t n) {
  Float32ReduceResult result;
  result.values.resize(n);
  if (n > 0) {
    std::memcpy(result.values.data(), raw.data.data(), raw.data.size());
  }
  result.stats = std::move(raw.stats);
  return result;
}

// ResourceExhausted when `bytes` of `what` cannot go in one gRPC message
// (gRPC would abort the process when it failed to serialise it).
absl::Status CheckInline(uint64_t bytes, absl::string_view what) {
  if (bytes <= kMaxInlineBytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      what, " has ", bytes, " bytes, over the ", kMaxInlineBytes,
      " a call can send inline (a gRPC message holds at most 2 GiB); send "
      "it through shared memory (RegisterShm, then ReduceShm)"));
}

absl::string_view ChannelStateName(grpc_connectivity_state state) {
  switch (state) {
    case GRPC_CHANNEL_IDLE:
      return "IDLE";
    case GRPC_CHANNEL_CONNECTING:
      return "CONNECTING";
    case GRPC_CHANNEL_READY:
      return "READY";
    case GRPC_CHANNEL_TRANSIENT_FAILURE:
      return "TRANSIENT_FAILURE (it cannot connect)";
    case GRPC_CHANNEL_SHUTDOWN:
      return "SHUTDOWN";
  }
  return "unknown";
}

// Saturating: an infinite timeout is time_point::max(), which gRPC reads as
// no deadline (now() + nanoseconds::max() overflowed).
std::chrono::system_clock::time_point DeadlineAfter(absl::Duration timeout) {
  return absl::ToChronoTime(absl::Now() + timeout);
}

// What the client can tell of a gossip request before it is sent; the
// daemon checks the rest (the topology's syntax, the world size, ranks
// agreeing), and names it in its error.
absl::Status CheckGossip(const std::string& tensor,
                         const v1::GossipSpec& gossip,
                         double consensus_distance) {
  if (gossip.topology().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Gossip of '", tensor,
        "': empty topology; expected ring, torus, torus:RxC, full or "
        "edges:A-B[:W],..."));
  }
  if (!std::isfinite(gossip.diffusion()) || gossip.diffusion() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Gossip of '", tensor, "': diffusion ", gossip.diffusion(),
                     "; expected a finite value >= 0 (0 = 1.0)"));
  }
  if (!std::isfinite(consensus_distance) || consensus_distance < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Gossip of '", tensor, "': consensus distance ", consensus_distance,
        "; expected a finite value >= 0 (0 = none reported)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status FromGrpcStatus(const grpc::Status& status, absl::string_view rpc,
                            absl::string_view target) {
  if (status.ok()) return absl::OkStatus();
  // grpc::StatusCode and absl::StatusCode share the google.rpc.Code values.
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat(rpc, " to gradcompd at ", target, ": ",
                                   status.error_message()));
}

size_t DTypeSize(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT16:
    case v1::DTYPE_BFLOAT16:
      return 2;
    case v1::DTYPE_FLOAT32:
      return 4;
    case v1::DTYPE_FLOAT64:
      return 8;
    default:
      return 0;
  }
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(
    const std::string& target, ClientOptions options) {
  if (target.empty()) {
    return absl::InvalidArgumentError(
        "empty gradcompd target; expected host:port or unix:/path");
  }
  if (options.rpc_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rpc_timeout must be positive, got ",
                     absl::FormatDuration(options.rpc_timeout)));
  }
  // A longer socket path: gRPC would fail every call with "Failed to
  // create secure client channel".
  if (const std::optional<absl::string_view> path = UnixSocketPath(target);
      path.has_value() && path->size() > kMaxUnixSocketPathBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the socket path of target '", target, "' has ", path->size(),
        " bytes; expected at most ", kMaxUnixSocketPathBytes,
        " (what a unix socket address holds)"));
  }
  if (options.client_id.size() > kMaxClientIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("client_id has ", options.client_id.size(),
                     " bytes; expected at most ", kMaxClientIdBytes));
  }
  // gRPC aborts the process on metadata it cannot send: refused here.
  for (const char c : options.client_id) {
    if (!absl::ascii_isprint(static_cast<unsigned char>(c))) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "client_id holds byte 0x%02x; expected printable ASCII",
          static_cast<unsigned char>(c)));
    }
  }
  if (options.client_id.empty()) {
    char host[256] = "host";
    gethostname(host, sizeof(host) - 1);
    std::random_device random;
    options.client_id = absl::StrFormat("%s.%d.%08x", host, getpid(), random());
  }
  const bool from_env = options.token.empty();
  if (from_env) {
    if (const char* token = std::getenv("GRADCOMP_TOKEN")) {
      options.token = token;
    }
  }
  absl::StatusOr<std::string> token = NormalizeBearerToken(options.token);
  if (!token.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the client token (",
        from_env ? "$GRADCOMP_TOKEN" : "ClientOptions::token", ") ",
        token.status().message(), ", as the daemon's --client_token_file"));
  }
  options.token = *std::move(token);
  grpc::ChannelArguments args;
  // Tensors travel inline: no 4 MiB cap on either direction.
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  // A daemon that restarts is dialled again within about a second of coming
  // back, not after gRPC's default backoff (up to 2 minutes) and name
  // re-resolution (at most every 30 s), every call failing at once with
  // UNAVAILABLE meanwhile (the Python client measured 9-10 s; 1 s after).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_DNS_MIN_TIME_BETWEEN_RESOLUTIONS_MS, 200);
  std::shared_ptr<grpc::Channel> channel = grpc::CreateCustomChannel(
      target, grpc::InsecureChannelCredentials(), args);
  return std::unique_ptr<Client>(
      new Client(target, options, std::move(channel)));
}

Client::Client(std::string target, ClientOptions options,
               std::shared_ptr<grpc::Channel> channel)
    : target_(std::move(target)),
      options_(options),
      channel_(std::move(channel)),
      stub_(v1::Gradcomp::NewStub(channel_)) {}

absl::Status Client::WaitForReady(absl::Duration timeout) {
  const absl::Time start = absl::Now();
  if (channel_->WaitForConnected(DeadlineAfter(timeout))) {
    return absl::OkStatus();
  }
  return absl::UnavailableError(absl::StrCat(
      "gradcompd at ", target_, " did not accept a connection: gave up after ",
      absl::FormatDuration(absl::Now() - start), " of ",
      absl::FormatDuration(timeout), " with the channel in state ",
      ChannelStateName(channel_->GetState(/*try_to_connect=*/false))));
}

absl::Status Client::WaitServing(absl::Duration timeout) {
  // grpc.health.v1 without its generated code: the request for the server's
  // overall health (service "") is the empty message, and the response's one
  // field, the status, is a varint of tag 1 (SERVING = 1).
  const grpc::internal::RpcMethod check("/grpc.health.v1.Health/Check",
                                        grpc::internal::RpcMethod::NORMAL_RPC,
                                        channel_);
  const absl::Time deadline = absl::Now() + timeout;
  std::string last = "no answer";
  while (true) {
    std::unique_ptr<grpc::ClientContext> context = NewContext();
    context->set_deadline(DeadlineAfter(std::clamp(
        deadline - absl::Now(), absl::Milliseconds(100), absl::Seconds(5))));
    grpc::Slice empty;
    const grpc::ByteBuffer request(&empty, 1);
    grpc::ByteBuffer response;
    const grpc::Status status =
        grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
            channel_.get(), check, context.get(), request, &response);
    if (status.ok()) {
      std::vector<grpc::Slice> slices;
      std::string bytes;
      if (response.Dump(&slices).ok()) {
        for (const grpc::Slice& slice : slices) {
          bytes.append(reinterpret_cast<const char*>(slice.begin()),
                       slice.size());
        }
      }
      const int serving =
          bytes.size() >= 2 && bytes[0] == '\x08' ? bytes[1] & 0x7f : 0;
      if (serving == 1) return absl::OkStatus();
      last = serving == 2 ? "NOT_SERVING" : absl::StrCat("status ", serving);
    } else {
      const absl::Status failed =
          FromGrpcStatus(status, "Health/Check", target_);
      last = absl::StrCat(absl::StatusCodeToString(failed.code()), ": ",
                          status.error_message());
    }
    if (absl::Now() + absl::Milliseconds(200) >= deadline) {
      return absl::UnavailableError(absl::StrCat(
          "gradcompd at ", target_, " was not SERVING within ",
          absl::FormatDuration(timeout), " (last: ", last,
          "); a daemon is NOT_SERVING until all its peers are connected"));
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
}

std::unique_ptr<grpc::ClientContext> Client::NewContext() const {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(DeadlineAfter(options_.rpc_timeout));
  context->AddMetadata("gradcomp-client-id", options_.client_id);
  if (!options_.token.empty()) {
    context->AddMetadata("authorization", "Bearer " + options_.token);
  }
  return context;
}

absl::StatusOr<ReduceResult> Client::ReduceBytes(
    const std::string& job, const std::string& tensor, int64_t step,
    v1::DType dtype, std::string data, absl::Span<const int64_t> shape,
    const std::optional<v1::CodecSpec>& codec,
    const std::optional<v1::ReduceBatch>& batch) {
  GC_RETURN_IF_ERROR(
      CheckInline(data.size(), absl::StrCat("tensor '", tensor, "'")));
  v1::ReduceRequest request;
  request.set_job(job);
  request.set_tensor(tensor);
  request.set_step(step);
  request.set_dtype(dtype);
  request.mutable_shape()->Add(shape.begin(), shape.end());
  request.set_data(std::move(data));
  if (codec) *request.mutable_codec() = *codec;
  if (batch) *request.mutable_batch() = *batch;
  return ReduceInline(std::move(request));
}

absl::StatusOr<ReduceResult> Client::ReduceInline(v1::ReduceRequest request) {
  const size_t input_bytes = request.data().size();
  v1::ReduceResponse response;
  GC_RETURN_IF_ERROR(
      FromGrpcStatus(stub_->Reduce(NewContext().get(), request, &response),
                     "Reduce", target_));
  if (response.data().size() != input_bytes) {
    return absl::InternalError(
        absl::StrCat("Reduce of '", request.tensor(), "': gradcompd at ",
                     target_, " returned ", response.data().size(),
                     " bytes for a ", input_bytes, "-byte input"));
  }
  // Callers (ToFloat32 among them) read the result as the input's dtype.
  if (response.dtype() != request.dtype()) {
    return absl::InternalError(
        absl::StrCat("Reduce of '", request.tensor(), "': gradcompd at ",
                     target_, " answered ", DTypeLabel(response.dtype()),
                     " for a ", DTypeLabel(request.dtype()), " request"));
  }
  ReduceResult result;
  result.dtype = response.dtype();
  result.data = std::move(*response.mutable_data());
  result.stats = std::move(*response.mutable_stats());
  return result;
}

absl::StatusOr<Float32ReduceResult> Client::Reduce(
    const std::string& job, const std::string& tensor, int64_t step,
    absl::Span<const float> values, absl::Span<const int64_t> shape,
    const std::optional<v1::CodecSpec>& codec,
    const std::optional<v1::ReduceBatch>& batch) {
  // The wire format is little-endian, like every host this runs on (x86-64,
  // aarch64): float memory is sent as it is.
  GC_RETURN_IF_ERROR(CheckInline(values.size() * sizeof(float),
                                 absl::StrCat("tensor '", tensor, "'")));
  std::string data(reinterpret_cast<const char*>(values.data()),
                   values.size() * sizeof(float));
  GC_ASSIGN_OR_RETURN(ReduceResult raw,
                      ReduceBytes(job, tensor, step, v1::DTYPE_FLOAT32,
                                  std::move(data), shape, codec, batch));
  return ToFloat32(std::move(raw), values.size());
}

absl::StatusOr<Float32ReduceResult> Client::Gossip(
    const std::string& job, const std::string& tensor, int64_t step,
    absl::Span<const float> values, absl::Span<const int64_t> shape,
    const v1::GossipSpec& gossip, double consensus_distance) {
  GC_RETURN_IF_ERROR(CheckGossip(tensor, gossip, consensus_distance));
  GC_RETURN_IF_ERROR(CheckInline(values.size() * sizeof(float),
                                 absl::StrCat("tensor '", tensor, "'")));
  v1::ReduceRequest request;
  request.set_job(job);
  request.set_tensor(tensor);
  request.set_step(step);
  request.set_dtype(v1::DTYPE_FLOAT32);
  request.mutable_shape()->Add(shape.begin(), shape.end());
  request.set_data(reinterpret_cast<const char*>(values.data()),
                   values.size() * sizeof(float));
  request.set_mode(v1::REDUCE_MODE_GOSSIP);
  *request.mutable_gossip() = gossip;
  request.set_consensus_distance(consensus_distance);
  GC_ASSIGN_OR_RETURN(ReduceResult raw, ReduceInline(std::move(request)));
  return ToFloat32(std::move(raw), values.size());
}

absl::Status Client::RegisterShm(const std::string& name,
                                 const std::string& shm_key, uint64_t offset,
                                 uint64_t byte_size) {
  v1::RegisterSystemSharedMemoryRequest request;
  request.set_name(name);
  request.set_shm_key(shm_key);
  request.set_offset(offset);
  request.set_byte_size(byte_size);
  v1::RegisterSystemSharedMemoryResponse response;
  return FromGrpcStatus(
      stub_->RegisterSystemSharedMemory(NewContext().get(), request, &response),
      "RegisterSystemSharedMemory", target_);
}

absl::Status Client::UnregisterShm(const std::string& name) {
  v1::UnregisterSharedMemoryRequest request;
  request.set_name(name);
  v1::UnregisterSharedMemoryResponse response;
  return FromGrpcStatus(
      stub_->UnregisterSharedMemory(NewContext().get(), request, &response),
      "UnregisterSharedMemory", target_);
}

absl::StatusOr<v1::SharedMemoryStatusResponse> Client::ShmStatus(
    const std::string& name) {
  v1::SharedMemoryStatusRequest request;
  request.set_name(name);
  v1::SharedMemoryStatusResponse response;
  GC_RETURN_IF_ERROR(FromGrpcStatus(
      stub_->SharedMemoryStatus(NewContext().get(), request, &response),
      "SharedMemoryStatus", target_));
  return response;
}

absl::StatusOr<v1::ReduceStats> Client::ReduceShm(
    const std::string& job, const std::string& tensor, int64_t step,
    v1::DType dtype, absl::Span<const int64_t> shape, const ShmSlice& input,
    const ShmSlice& output, const std::optional<v1::CodecSpec>& codec,
    const std::optional<v1::ReduceBatch>& batch) {
  v1::ReduceRequest request;
  request.set_job(job);
  request.set_tensor(tensor);
  request.set_step(step);
  request.set_dtype(dtype);
  request.mutable_shape()->Add(shape.begin(), shape.end());
  *request.mutable_input_shm() = SliceProto(input);
  *request.mutable_output_shm() = SliceProto(output);
  if (codec) *request.mutable_codec() = *codec;
  if (batch) *request.mutable_batch() = *batch;
  v1::ReduceResponse response;
  GC_RETURN_IF_ERROR(
      FromGrpcStatus(stub_->Reduce(NewContext().get(), request, &response),
                     "Reduce", target_));
  return std::move(*response.mutable_stats());
}

absl::StatusOr<std::vector<absl::StatusOr<v1::ReduceStats>>>
Client::ReduceShmBucket(const std::string& job, int64_t step, v1::DType dtype,
                        absl::Span<const ShmPart> parts, const ShmSlice& input,
                        const ShmSlice& output,
                        const std::optional<v1::CodecSpec>& codec,
                        const std::optional<v1::ReduceBatch>& batch) {
  if (parts.empty()) {
    return absl::InvalidArgumentError(
        "ReduceShmBucket: expected at least one part, got none");
  }
  v1::ReduceRequest request;
  request.set_job(job);
  request.set_step(step);
  request.set_dtype(dtype);
  *request.mutable_input_shm() = SliceProto(input);
  *request.mutable_output_shm() = SliceProto(output);
  for (const ShmPart& part : parts) {
    v1::ReducePart* added = request.add_parts();
    added->set_tensor(part.tensor);
    added->mutable_shape()->Add(part.shape.begin(), part.shape.end());
    added->set_offset(part.offset);
  }
  if (codec) *request.mutable_codec() = *codec;
  if (batch) *request.mutable_batch() = *batch;

  // One request, one answer: written, closed, then read to the end, as
  // Finish waits while any answer is left unread.
  const std::unique_ptr<grpc::ClientContext> context = NewContext();
  std::unique_ptr<
      grpc::ClientReaderWriter<v1::ReduceRequest, v1::ReduceStreamResponse>>
      stream = stub_->ReduceStream(context.get());
  stream->Write(request);
  stream->WritesDone();
  v1::ReduceStreamResponse answer;
  int answers = 0;
  for (v1::ReduceStreamResponse next; stream->Read(&next);) {
    if (++answers == 1) answer = std::move(next);
  }
  GC_RETURN_IF_ERROR(FromGrpcStatus(stream->Finish(), "ReduceStream", target_));
  if (answers == 0) {
    return absl::InternalError(absl::StrCat("ReduceStream to gradcompd at ",
                                            target_,
                                            ": the stream ended without "
                                            "an answer to the request with ",
                                            parts.size(), " parts"));
  }
  if (answers > 1) {
    return absl::InternalError(
        absl::StrCat("ReduceStream to gradcompd at ", target_, ": ", answers,
                     " answers to the one request with ", parts.size(),
                     " parts, expected 1"));
  }
  GC_RETURN_IF_ERROR(AnswerStatus(answer, target_));
  if (answer.part_results_size() != static_cast<int>(parts.size())) {
    return absl::InternalError(
        absl::StrCat("ReduceStream to gradcompd at ", target_, ": ",
                     answer.part_results_size(), " part results for ",
                     parts.size(), " parts"));
  }
  std::vector<absl::StatusOr<v1::ReduceStats>> results;
  results.reserve(parts.size());
  for (int i = 0; i < answer.part_results_size(); ++i) {
    v1::ReduceStreamResponse& part = *answer.mutable_part_results(i);
    if (PartAnswerId(part) != static_cast<uint64_t>(i)) {
      return absl::InternalError(absl::StrCat(
          "ReduceStream to gradcompd at ", target_, ": part result ", i,
          " answers request_id ", PartAnswerId(part), ", expected ", i,
          " (part '", parts[i].tensor, "')"));
    }
    absl::Status status = AnswerStatus(part, target_);
    if (status.ok()) {
      results.push_back(std::move(*part.mutable_result()->mutable_stats()));
    } else {
      results.push_back(std::move(status));
    }
  }
  return results;
}

absl::StatusOr<v1::GetInfoResponse> Client::GetInfo() {
  v1::GetInfoResponse response;
  GC_RETURN_IF_ERROR(FromGrpcStatus(
      stub_->GetInfo(NewContext().get(), v1::GetInfoRequest(), &response),
      "GetInfo", target_));
  return response;
}

absl::StatusOr<v1::GetPolicyResponse> Client::GetPolicy() {
  v1::GetPolicyResponse response;
  GC_RETURN_IF_ERROR(FromGrpcStatus(
      stub_->GetPolicy(NewContext().get(), v1::GetPolicyRequest(), &response),
      "GetPolicy", target_));
  return response;
}

absl::StatusOr<std::string> Client::SetPolicy(
    const v1::Policy& policy, std::optional<int64_t> from_step) {
  v1::SetPolicyRequest request;
  *request.mutable_policy() = policy;
  if (from_step.has_value()) request.set_from_step(*from_step);
  v1::SetPolicyResponse response;
  GC_RETURN_IF_ERROR(
      FromGrpcStatus(stub_->SetPolicy(NewContext().get(), request, &response),
                     "SetPolicy", target_));
  if (from_step.has_value() && !response.has_from_step()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "SetPolicy to gradcompd at ", target_,
        ": the daemon does not know from_step (a version before it) and "
        "applied the policy (hash ",
        response.hash(),
        ") to every step at once; upgrade it, or set the policy only while "
        "no step runs"));
  }
  return response.hash();
}

absl::StatusOr<v1::DeclareTensorsResponse> Client::DeclareTensors(
    const v1::DeclareTensorsRequest& request) {
  v1::DeclareTensorsResponse response;
  GC_RETURN_IF_ERROR(FromGrpcStatus(
      stub_->DeclareTensors(NewContext().get(), request, &response),
      "DeclareTensors", target_));
  return response;
}

absl::StatusOr<std::string> Client::ExportState(const std::string& job) {
  v1::ExportStateRequest request;
  request.set_job(job);
  std::unique_ptr<grpc::ClientContext> context = NewContext();
  std::unique_ptr<grpc::ClientReader<v1::ExportStateResponse>> reader =
      stub_->ExportStateStream(context.get(), request);
  std::string state;
  for (v1::ExportStateResponse piece; reader->Read(&piece);) {
    state.append(piece.state());
  }
  GC_RETURN_IF_ERROR(
      FromGrpcStatus(reader->Finish(), "ExportStateStream", target_));
  return state;
}

absl::Status Client::ImportState(const std::string& job, std::string state) {
  std::unique_ptr<grpc::ClientContext> context = NewContext();
  v1::ImportStateResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::ImportStateRequest>> writer =
      stub_->ImportStateStream(context.get(), &response);
  const absl::string_view blob = state;
  size_t sent = 0;
  bool open = true;
  do {
    v1::ImportStateRequest piece;
    if (sent == 0) {
      piece.set_job(job);
      piece.set_state_bytes(blob.size());
    }
    piece.set_state(std::string(blob.substr(sent, kStatePieceBytes)));
    sent += piece.state().size();
    // Refused: the daemon has ended the call, and Finish says why.
    open = writer->Write(piece);
  } while (open && sent < blob.size());
  if (open) writer->WritesDone();
  return FromGrpcStatus(writer->Finish(), "ImportStateStream", target_);
}

absl::StatusOr<v1::ReleaseJobResponse> Client::ReleaseJob(
    const std::string& job) {
  v1::ReleaseJobRequest request;
  request.set_job(job);
  v1::ReleaseJobResponse response;
  GC_RETURN_IF_ERROR(
      FromGrpcStatus(stub_->ReleaseJob(NewContext().get(), request, &response),
                     "ReleaseJob", target_));
  return response;
}

}  // namespace gradcomp::client
