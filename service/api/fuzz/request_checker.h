// Feeds one fuzzed client request to the daemon's real request path, with
// no network: a GradcompService over an Engine with a local (world size 1)
// collective and a shared-memory registry holding one real region. The
// first byte picks the RPC, the rest is its serialized request; whatever
// the bytes, the handler must answer with a status, never crash, hang or
// leak. Used by request_fuzzer (libFuzzer) and request_corpus_test (gcc).
//
//   RequestChecker& checker = RequestChecker::Get();
//   checker.Check(data, size);
#ifndef GRADCOMP_SERVICE_API_FUZZ_REQUEST_CHECKER_H_
#define GRADCOMP_SERVICE_API_FUZZ_REQUEST_CHECKER_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "client/cpp/shm_region.h"
#include "codecs/state.h"
#include "service/api/gradcomp_service.h"
#include "service/collective/local_collective.h"
#include "service/engine/engine.h"
#include "service/memory/shared_memory_registry.h"
#include "service/metrics/metrics.h"

namespace gradcomp::service {

// The RPC an input's first byte selects (modulo the count).
enum class FuzzedRpc : uint8_t {
  kReduce = 0,
  kRegisterSystemSharedMemory = 1,
  kDeclareTensors = 2,
  kSetPolicy = 3,
  kImportState = 4,
  kSharedMemoryStatus = 5,
  // A ReduceRequest with parts: SplitParts, then each part's Reduce, as
  // ReduceStream serves it.
  kReduceParts = 6,
  // ReleaseJob; once it succeeds, the job exports no state.
  kReleaseJob = 7,
  kCount = 8,
};

// The region every fuzzed Reduce may name as its input_shm/output_shm.
inline constexpr char kFuzzRegionName[] = "fuzz";
inline constexpr uint64_t kFuzzRegionBytes = 64 << 10;

class RequestChecker {
 public:
  // One per process: the daemon's pieces are built once, like a daemon's.
  static RequestChecker& Get();

  // Runs one input. Returns the gRPC status code the handler answered
  // (OK included); -1 if the bytes do not parse as the selected request.
  int Check(const uint8_t* data, size_t size);

 private:
  RequestChecker();

  codecs::StateStore store_;
  Metrics metrics_;
  LocalCollective collective_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<SharedMemoryRegistry> shm_;
  std::unique_ptr<client::ShmRegion> region_;
  std::unique_ptr<GradcompService> service_;
};

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_API_FUZZ_REQUEST_CHECKER_H_
