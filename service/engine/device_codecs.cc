#include "service/engine/device_codecs.h"

#include <iostream>
#include <utility>

#include "service/engine/codec_cache.h"

namespace gradcomp::service {

std::shared_ptr<const DeviceCodec> DeviceCodecs::Get(const CodecSpec& spec) {
  auto key = std::make_pair(spec.name, spec.params);
  {
    absl::MutexLock lock(&mu_);
    auto it = twins_.find(key);
    if (it != twins_.end()) return it->second;
  }
  absl::StatusOr<std::unique_ptr<DeviceCodec>> created =
      CreateDeviceCodec(spec);
  absl::MutexLock lock(&mu_);
  if (!created.ok()) {
    // Once per codec name (or once for "no GPU"): a policy that sends many
    // tensors to a codec without a twin must not flood the log.
    const bool no_gpu = absl::IsUnavailable(created.status());
    if (said_.insert(no_gpu ? std::string() : spec.name).second) {
      std::cerr << "gradcompd: "
                << (no_gpu ? std::string("no usable GPU")
                           : "codec '" + spec.name + "' has no GPU twin")
                << " (" << created.status().message()
                << "): its CUDA tensors are copied to the host and reduced "
                   "by the CPU codec\n";
    }
    return nullptr;
  }
  std::shared_ptr<const DeviceCodec> twin = *std::move(created);
  // Bounded as CodecCache is: request overrides may carry any parameters.
  if (twins_.size() >= CodecCache::kMaxEntries) return twin;
  return twins_.emplace(std::move(key), std::move(twin)).first->second;
}

}  // namespace gradcomp::service
