#include "service/transport/nccl_transport_exchange.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"

namespace gradcomp::service {
namespace {

using codecs::cuda::CudaStatus;

// Per peer and round: {present (0 or 1), payload bytes}.
constexpr uint64_t kHeaderBytes = 2 * sizeof(uint64_t);
// A header announcing more than this is not one a peer of ours wrote.
constexpr uint64_t kMaxPayloadBytes = uint64_t{1} << 40;
constexpr absl::Duration kPollInterval = absl::Microseconds(20);

absl::Status CudaAt(cudaError_t error, const char* what, int rank) {
  absl::Status status = CudaStatus(error, what);
  if (status.ok()) return status;
  return absl::Status(status.code(),
                      absl::StrCat("rank ", rank, ": ", status.message()));
}

#define GC_NCCL_RETURN_IF_ERROR(expr, rank) \
  GC_RETURN_IF_ERROR(NcclStatus((expr), #expr, (rank)))
#define GC_CUDA_AT_RETURN_IF_ERROR(expr, rank) \
  GC_RETURN_IF_ERROR(CudaAt((expr), #expr, (rank)))

// Polls until the communicator leaves ncclInProgress or `deadline` passes.
absl::Status AwaitComm(ncclComm_t comm, int rank, absl::Time deadline,
                       absl::string_view what) {
  while (true) {
    ncclResult_t state = ncclSuccess;
    GC_NCCL_RETURN_IF_ERROR(ncclCommGetAsyncError(comm, &state), rank);
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) {
      return NcclStatus(state, "ncclCommGetAsyncError (asynchronous error)",
                        rank);
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "rank ", rank, ": NCCL ", what,
          " did not complete by its deadline; expected every rank of the "
          "communicator to take part"));
    }
    absl::SleepFor(kPollInterval);
  }
}

}  // namespace

absl::Status NcclStatus(ncclResult_t result, const char* what, int rank) {
  if (result == ncclSuccess || result == ncclInProgress) {
    return absl::OkStatus();
  }
  std::string message = absl::StrFormat("rank %d: NCCL: %s failed: %s", rank,
                                        what, ncclGetErrorString(result));
  const char* detail = ncclGetLastError(nullptr);
  if (detail != nullptr && detail[0] != '\0') {
    absl::StrAppend(&message, " (", detail, ")");
  }
  switch (result) {
    case ncclSystemError:
    case ncclRemoteError:
      return absl::UnavailableError(message);
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return absl::InvalidArgumentError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::StatusOr<std::string> NewNcclUniqueId() {
  ncclUniqueId id;
  GC_NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id), 0);
  return std::string(id.internal, NCCL_UNIQUE_ID_BYTES);
}

void NcclExchange::PinnedDeleter::operator()(char* p) const { cudaFreeHost(p); }

NcclExchange::NcclExchange(ncclComm_t comm, cudaStream_t stream, int world_size,
                           int rank, int device)
    : comm_(comm),
      stream_(stream),
      world_size_(world_size),
      rank_(rank),
      device_(device) {}

absl::StatusOr<std::unique_ptr<NcclExchange>> NcclExchange::Create(
    absl::string_view unique_id, int world_size, int rank, int device,
    absl::Duration timeout) {
  if (unique_id.size() != NCCL_UNIQUE_ID_BYTES) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, ": NCCL unique id has ", unique_id.size(),
                     " bytes, expected ", NCCL_UNIQUE_ID_BYTES));
  }
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("NCCL rank ", rank, " of world size ", world_size,
                     ": expected 0 <= rank < world size"));
  }
  GC_RETURN_IF_ERROR(codecs::cuda::CudaDeviceAvailable());
  const absl::Time deadline = absl::Now() + timeout;
  GC_CUDA_AT_RETURN_IF_ERROR(cudaSetDevice(device), rank);
  cudaStream_t stream;
  GC_CUDA_AT_RETURN_IF_ERROR(
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), rank);
  ncclUniqueId id;
  std::memcpy(id.internal, unique_id.data(), NCCL_UNIQUE_ID_BYTES);
  // Non-blocking, so that a rank that never joins (or later stalls) ends in
  // DeadlineExceeded and ncclCommAbort instead of a hang.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  absl::Status status =
      NcclStatus(ncclCommInitRankConfig(&comm, world_size, id, rank, &config),
                 "ncclCommInitRankConfig", rank);
  if (status.ok()) {
    status = AwaitComm(comm, rank, deadline, "communicator initialisation");
  }
  if (!status.ok()) {
    if (comm != nullptr) ncclCommAbort(comm);
    cudaStreamDestroy(stream);
    return status;
  }
  return std::unique_ptr<NcclExchange>(
      new NcclExchange(comm, stream, world_size, rank, device));
}

NcclExchange::~NcclExchange() {
  // Abort, not Finalize + Destroy: a peer that is gone cannot make a clean
  // teardown hang.
  Abort();
  cudaStreamSynchronize(stream_);
  cudaStreamDestroy(stream_);
}

void NcclExchange::Abort() {
  if (comm_ != nullptr) ncclCommAbort(comm_);
  comm_ = nullptr;
}

absl::Status NcclExchange::Grow(Staging& staging, uint64_t bytes) {
  if (bytes <= staging.capacity) return absl::OkStatus();
  const uint64_t capacity = std::max(bytes, 2 * staging.capacity);
  void* host = nullptr;
  GC_CUDA_AT_RETURN_IF_ERROR(cudaMallocHost(&host, capacity), rank_);
  staging.host.reset(static_cast<char*>(host));
  GC_ASSIGN_OR_RETURN(staging.device,
                      codecs::cuda::DeviceBuffer::Create(capacity));
  staging.capacity = capacity;
  return absl::OkStatus();
}

absl::Status NcclExchange::EndGroup(const absl::Status& queued,
                                    absl::Time deadline) {
  const absl::Status ended = NcclStatus(ncclGroupEnd(), "ncclGroupEnd", rank_);
  GC_RETURN_IF_ERROR(queued);
  GC_RETURN_IF_ERROR(ended);
  return AwaitComm(comm_, rank_, deadline, "group launch");
}

absl::Status NcclExchange::Wait(absl::Time deadline) {
  while (true) {
    const cudaError_t done = cudaStreamQuery(stream_);
    if (done == cudaSuccess) return absl::OkStatus();
    if (done != cudaErrorNotReady) {
      return CudaAt(done, "cudaStreamQuery", rank_);
    }
    GC_RETURN_IF_ERROR(AwaitComm(comm_, rank_, deadline, "send/receive round"));
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "rank ", rank_,
          ": NCCL send/receive round did not complete by its deadline; "
          "expected every peer to run the same round"));
    }
    absl::SleepFor(kPollInterval);
  }
}

absl::StatusOr<std::vector<std::optional<codecs::Bytes>>> NcclExchange::Run(
    const std::vector<int>& peers, const std::vector<Outgoing>& out,
    absl::Time deadline) {
  if (!broken_.ok()) return broken_;
  if (peers.size() != out.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank_, ": NCCL round with ", peers.size(),
                     " peers and ", out.size(),
                     " outgoing messages; expected "
                     "one message slot per peer"));
  }
  for (int peer : peers) {
    if (peer < 0 || peer >= world_size_) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", rank_, ": NCCL peer ", peer, " is not in [0, ",
                       world_size_, ")"));
    }
  }
  absl::StatusOr<std::vector<std::optional<codecs::Bytes>>> in =
      RunRound(peers, out, deadline);
  if (!in.ok()) {
    broken_ = in.status();
    Abort();
  }
  return in;
}

absl::StatusOr<std::vector<std::optional<codecs::Bytes>>>
NcclExchange::RunRound(const std::vector<int>& peers,
                       const std::vector<Outgoing>& out, absl::Time deadline) {
  const size_t n = peers.size();
  std::vector<std::optional<codecs::Bytes>> in(n);
  if (n == 0) return in;
  GC_CUDA_AT_RETURN_IF_ERROR(cudaSetDevice(device_), rank_);
  if (payload_out_.size() < n) {
    payload_out_.resize(n);
    payload_in_.resize(n);
  }

  // Headers first: after them every rank knows which payloads come.
  GC_RETURN_IF_ERROR(Grow(headers_out_, n * kHeaderBytes));
  GC_RETURN_IF_ERROR(Grow(headers_in_, n * kHeaderBytes));
  std::vector<uint64_t> sizes(n, 0);
  auto* header_out = reinterpret_cast<uint64_t*>(headers_out_.host.get());
  for (size_t i = 0; i < n; ++i) {
    for (absl::string_view part : out[i].parts) sizes[i] += part.size();
    header_out[2 * i] = out[i].present ? 1 : 0;
    header_out[2 * i + 1] = out[i].present ? sizes[i] : 0;
  }
  GC_CUDA_AT_RETURN_IF_ERROR(
      cudaMemcpyAsync(headers_out_.device.data(), headers_out_.host.get(),
                      n * kHeaderBytes, cudaMemcpyHostToDevice, stream_),
      rank_);
  GC_NCCL_RETURN_IF_ERROR(ncclGroupStart(), rank_);
  absl::Status queued;
  for (size_t i = 0; i < n; ++i) {
    queued.Update(
        NcclStatus(ncclSend(headers_out_.device.as<char>() + i * kHeaderBytes,
                            kHeaderBytes, ncclUint8, peers[i], comm_, stream_),
                   "ncclSend (header)", rank_));
    queued.Update(
        NcclStatus(ncclRecv(headers_in_.device.as<char>() + i * kHeaderBytes,
                            kHeaderBytes, ncclUint8, peers[i], comm_, stream_),
                   "ncclRecv (header)", rank_));
  }
  GC_RETURN_IF_ERROR(EndGroup(queued, deadline));
  GC_CUDA_AT_RETURN_IF_ERROR(
      cudaMemcpyAsync(headers_in_.host.get(), headers_in_.device.data(),
                      n * kHeaderBytes, cudaMemcpyDeviceToHost, stream_),
      rank_);
  GC_RETURN_IF_ERROR(Wait(deadline));

  const auto* header_in =
      reinterpret_cast<const uint64_t*>(headers_in_.host.get());
  std::vector<uint64_t> in_sizes(n, 0);
  bool any_payload = false;
  for (size_t i = 0; i < n; ++i) {
    const uint64_t present = header_in[2 * i];
    in_sizes[i] = header_in[2 * i + 1];
    if (present > 1 || in_sizes[i] > kMaxPayloadBytes ||
        (present == 0 && in_sizes[i] != 0)) {
      return absl::DataLossError(absl::StrCat(
          "rank ", rank_, ": NCCL header from rank ", peers[i], " is {",
          present, ", ", in_sizes[i],
          "}; expected {0, 0} or {1, size <= ", kMaxPayloadBytes, "}"));
    }
    if (present == 1) in[i].emplace();
    if (out[i].present && sizes[i] > 0) {
      GC_RETURN_IF_ERROR(Grow(payload_out_[i], sizes[i]));
      char* host = payload_out_[i].host.get();
      for (absl::string_view part : out[i].parts) {
        std::memcpy(host, part.data(), part.size());
        host += part.size();
      }
      GC_CUDA_AT_RETURN_IF_ERROR(
          cudaMemcpyAsync(payload_out_[i].device.data(),
                          payload_out_[i].host.get(), sizes[i],
                          cudaMemcpyHostToDevice, stream_),
          rank_);
      any_payload = true;
    }
    if (in_sizes[i] > 0) {
      GC_RETURN_IF_ERROR(Grow(payload_in_[i], in_sizes[i]));
      any_payload = true;
    }
  }
  if (!any_payload) return in;

  GC_NCCL_RETURN_IF_ERROR(ncclGroupStart(), rank_);
  for (size_t i = 0; i < n; ++i) {
    if (out[i].present && sizes[i] > 0) {
      queued.Update(NcclStatus(ncclSend(payload_out_[i].device.data(), sizes[i],
                                        ncclUint8, peers[i], comm_, stream_),
                               "ncclSend (payload)", rank_));
    }
    if (in_sizes[i] > 0) {
      queued.Update(
          NcclStatus(ncclRecv(payload_in_[i].device.data(), in_sizes[i],
                              ncclUint8, peers[i], comm_, stream_),
                     "ncclRecv (payload)", rank_));
    }
  }
  GC_RETURN_IF_ERROR(EndGroup(queued, deadline));
  for (size_t i = 0; i < n; ++i) {
    if (in_sizes[i] == 0) continue;
    GC_CUDA_AT_RETURN_IF_ERROR(
        cudaMemcpyAsync(payload_in_[i].host.get(), payload_in_[i].device.data(),
                        in_sizes[i], cudaMemcpyDeviceToHost, stream_),
        rank_);
  }
  GC_RETURN_IF_ERROR(Wait(deadline));
  for (size_t i = 0; i < n; ++i) {
    if (in_sizes[i] > 0) in[i]->assign(payload_in_[i].host.get(), in_sizes[i]);
  }
  return in;
}

}  // namespace gradcomp::service
