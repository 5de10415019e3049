#include "service/api/fuzz/request_checker.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "codecs/builtin.h"
#include "grpcpp/grpcpp.h"
#include "service/api/request_parts.h"

namespace gradcomp::service {
namespace {

[[noreturn]] void Fail(const std::string& why) {
  std::fprintf(stderr, "request_fuzzer: %s\n", why.c_str());
  std::abort();
}

// Small limits, so that a fuzzed size or count meets them quickly and an
// input can never make the process take gigabytes.
EngineOptions FuzzEngineOptions() {
  EngineOptions options;
  options.max_tensor_bytes = 1 << 20;
  options.memory_budget_bytes = 64 << 20;
  options.memory_wait = absl::ZeroDuration();
  // A batch whose other members never come fails at once, not in 60 s.
  options.batch_timeout = absl::Milliseconds(1);
  options.quotas.max_tensors_per_job = 256;
  options.quotas.max_concurrent_jobs = 4;
  options.quotas.max_state_bytes_per_job = 16 << 20;
  return options;
}

// Parses `bytes` as a Request and calls `handler` with a fresh context;
// returns its status code, or -1 if the bytes are not a Request.
template <typename Request, typename Response, typename Handler>
int Call(const uint8_t* bytes, size_t size, Handler handler) {
  Request request;
  if (!request.ParseFromArray(bytes, static_cast<int>(size))) return -1;
  grpc::ServerContext context;
  Response response;
  const grpc::Status status = handler(&context, &request, &response);
  return static_cast<int>(status.error_code());
}

// Whether `part` lies within `whole`, in the same region.
bool Within(const v1::SharedMemorySlice& part,
            const v1::SharedMemorySlice& whole) {
  return part.region() == whole.region() && part.offset() >= whole.offset() &&
         part.byte_size() <= whole.byte_size() &&
         part.offset() - whole.offset() <= whole.byte_size() - part.byte_size();
}

}  // namespace

RequestChecker& RequestChecker::Get() {
  static RequestChecker* checker = new RequestChecker();
  return *checker;
}

RequestChecker::RequestChecker() : metrics_(&store_, "fuzz") {
  absl::StatusOr<std::unique_ptr<Engine>> engine =
      Engine::Create(FuzzEngineOptions(), codecs::BuiltinCodecs(), &store_,
                     &collective_, &metrics_, Policy());
  if (!engine.ok()) Fail(engine.status().ToString());
  engine_ = std::move(*engine);
  SharedMemoryOptions shm_options;
  shm_options.reclaim_interval = absl::ZeroDuration();
  shm_ = std::make_unique<SharedMemoryRegistry>(shm_options, &metrics_);
  absl::StatusOr<std::unique_ptr<client::ShmRegion>> region =
      client::ShmRegion::Create(kFuzzRegionBytes, "fuzz");
  if (!region.ok()) Fail(region.status().ToString());
  region_ = std::move(*region);
  // A default ServerContext has no peer: the registry's client id is "".
  const absl::Status registered = shm_->RegisterSystem(
      "", kFuzzRegionName, region_->key(), 0, kFuzzRegionBytes);
  if (!registered.ok()) Fail(registered.ToString());
  // The registry holds the object open, and this checker lives until the
  // fuzzer exits without running its destructor: the name goes now, so that
  // no run leaves an object in /dev/shm.
  shm_unlink(region_->key().c_str());
  StreamOptions one_worker;
  one_worker.pool.running = 1;
  one_worker.pool.threads = 1;
  service_ = std::make_unique<GradcompService>(
      engine_.get(), &metrics_, one_worker, DaemonSettings(), shm_.get());
}

int RequestChecker::Check(const uint8_t* data, size_t size) {
  if (size == 0) return -1;
  const auto rpc =
      static_cast<FuzzedRpc>(data[0] % static_cast<uint8_t>(FuzzedRpc::kCount));
  const uint8_t* bytes = data + 1;
  const size_t n = size - 1;
  GradcompService* service = service_.get();
  switch (rpc) {
    case FuzzedRpc::kReduce:
      return Call<v1::ReduceRequest, v1::ReduceResponse>(
          bytes, n, [service](auto* c, auto* q, auto* r) {
            return service->Reduce(c, q, r);
          });
    case FuzzedRpc::kRegisterSystemSharedMemory: {
      v1::RegisterSystemSharedMemoryRequest request;
      if (!request.ParseFromArray(bytes, static_cast<int>(n))) return -1;
      grpc::ServerContext context;
      v1::RegisterSystemSharedMemoryResponse response;
      const grpc::Status status =
          service->RegisterSystemSharedMemory(&context, &request, &response);
      // Only the fixture's region and names under the prefix can map.
      if (status.ok()) {
        if (request.name() == kFuzzRegionName) {
          Fail("a second region named 'fuzz' was registered");
        }
        grpc::ServerContext unregister_context;
        v1::UnregisterSharedMemoryRequest unregister;
        unregister.set_name(request.name());
        v1::UnregisterSharedMemoryResponse unregistered;
        if (!service
                 ->UnregisterSharedMemory(&unregister_context, &unregister,
                                          &unregistered)
                 .ok()) {
          Fail("a region just registered could not be unregistered");
        }
      }
      return static_cast<int>(status.error_code());
    }
    case FuzzedRpc::kDeclareTensors:
      return Call<v1::DeclareTensorsRequest, v1::DeclareTensorsResponse>(
          bytes, n, [service](auto* c, auto* q, auto* r) {
            return service->DeclareTensors(c, q, r);
          });
    case FuzzedRpc::kSetPolicy: {
      const int code = Call<v1::SetPolicyRequest, v1::SetPolicyResponse>(
          bytes, n, [service](auto* c, auto* q, auto* r) {
            return service->SetPolicy(c, q, r);
          });
      // Back to the default, so that every input meets the same daemon.
      if (code == 0) {
        const absl::Status reset = engine_->SetPolicy(Policy()).status();
        if (!reset.ok()) Fail(reset.ToString());
      }
      return code;
    }
    case FuzzedRpc::kImportState:
      return Call<v1::ImportStateRequest, v1::ImportStateResponse>(
          bytes, n, [service](auto* c, auto* q, auto* r) {
            return service->ImportState(c, q, r);
          });
    case FuzzedRpc::kSharedMemoryStatus:
      return Call<v1::SharedMemoryStatusRequest,
                  v1::SharedMemoryStatusResponse>(
          bytes, n, [service](auto* c, auto* q, auto* r) {
            return service->SharedMemoryStatus(c, q, r);
          });
    case FuzzedRpc::kReduceParts: {
      v1::ReduceRequest request;
      if (!request.ParseFromArray(bytes, static_cast<int>(n))) return -1;
      absl::StatusOr<SplitRequest> split = SplitParts(request);
      if (!split.ok()) return static_cast<int>(split.status().code());
      int first_error = 0;
      // Each part alone (the unary call has no batch to share).
      for (const v1::ReduceRequest& part : split->parts) {
        // A part never reaches past the slices the request named; one
        // without slices holds no bytes and goes inline, empty.
        if (!part.has_input_shm() && !part.has_output_shm()) {
          if (!part.has_data() || !part.data().empty() ||
              std::find(part.shape().begin(), part.shape().end(), 0) ==
                  part.shape().end()) {
            Fail("SplitParts left a part with elements without its slices");
          }
        } else if (!Within(part.input_shm(), request.input_shm()) ||
                   !Within(part.output_shm(), request.output_shm())) {
          Fail("SplitParts made a part outside the request's slices");
        }
        grpc::ServerContext context;
        v1::ReduceResponse response;
        const int code = static_cast<int>(
            service->Reduce(&context, &part, &response).error_code());
        if (first_error == 0) first_error = code;
      }
      return first_error;
    }
    case FuzzedRpc::kReleaseJob: {
      v1::ReleaseJobRequest request;
      if (!request.ParseFromArray(bytes, static_cast<int>(n))) return -1;
      grpc::ServerContext context;
      v1::ReleaseJobResponse response;
      const grpc::Status status =
          service->ReleaseJob(&context, &request, &response);
      if (status.ok()) {
        absl::StatusOr<std::string> left = engine_->ExportState(request.job());
        absl::StatusOr<std::string> none =
            codecs::StateStore().Export("", {0, engine_->world_size()});
        if (!left.ok() || !none.ok() || *left != *none) {
          Fail("a released job still exports state");
        }
      }
      return static_cast<int>(status.error_code());
    }
    case FuzzedRpc::kCount:
      break;
  }
  return -1;
}

}  // namespace gradcomp::service
