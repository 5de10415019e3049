// Codec instances by (name, params), created once through the registry and
// shared: codecs are immutable and thread-safe, and creating one parses and
// validates its parameters, which need not happen per tensor.
//
//   CodecCache cache(codecs::BuiltinCodecs());
//   GC_ASSIGN_OR_RETURN(std::shared_ptr<const codecs::Codec> codec,
//                       cache.Get({"topk", {{"ratio", "0.01"}}}));
#ifndef GRADCOMP_SERVICE_ENGINE_CODEC_CACHE_H_
#define GRADCOMP_SERVICE_ENGINE_CODEC_CACHE_H_

#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "codecs/codec.h"
#include "codecs/registry.h"
#include "service/engine/policy.h"

namespace gradcomp::service {

class CodecCache {
 public:
  // Request overrides may carry arbitrary parameters; past this many
  // entries new specs are created per call instead of cached, so a client
  // cannot grow the daemon's memory without bound.
  static constexpr size_t kMaxEntries = 256;

  explicit CodecCache(const codecs::CodecRegistry& registry)
      : registry_(registry) {}

  // The codec of `spec`; InvalidArgument for an unknown name (listing the
  // known codecs) or bad parameters (listing the accepted ones).
  absl::StatusOr<std::shared_ptr<const codecs::Codec>> Get(
      const CodecSpec& spec) ABSL_LOCKS_EXCLUDED(mu_);

  size_t size() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const codecs::CodecRegistry& registry_;
  mutable absl::Mutex mu_;
  std::map<std::pair<std::string, std::map<std::string, std::string>>,
           std::shared_ptr<const codecs::Codec>>
      codecs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_ENGINE_CODEC_CACHE_H_
