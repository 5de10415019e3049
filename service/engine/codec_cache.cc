#include "service/engine/codec_cache.h"

#include <utility>

#include "base/status_macros.h"

namespace gradcomp::service {

absl::StatusOr<std::shared_ptr<const codecs::Codec>> CodecCache::Get(
    const CodecSpec& spec) {
  auto key = std::make_pair(spec.name, spec.params);
  {
    absl::MutexLock lock(&mu_);
    auto it = codecs_.find(key);
    if (it != codecs_.end()) return it->second;
  }
  // Created outside the lock: a factory may be slow, and two threads making
  // the same codec at once is harmless (the first one stored wins).
  GC_ASSIGN_OR_RETURN(std::unique_ptr<codecs::Codec> created,
                      CreateCodec(registry_, spec));
  std::shared_ptr<const codecs::Codec> codec = std::move(created);
  absl::MutexLock lock(&mu_);
  if (codecs_.size() >= kMaxEntries) return codec;
  return codecs_.emplace(std::move(key), std::move(codec)).first->second;
}

size_t CodecCache::size() const {
  absl::MutexLock lock(&mu_);
  return codecs_.size();
}

}  // namespace gradcomp::service
