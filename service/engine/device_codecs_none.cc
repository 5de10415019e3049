// DeviceCodecs without the CUDA toolkit: no twins, no device copies.
#include <string>

#include "service/engine/device_codecs.h"

namespace gradcomp::service {
namespace {

constexpr char kNoCuda[] =
    "this gradcompd was built without CUDA (GRADCOMP_NO_CUDA=1 or no "
    "toolkit)";

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceCodec>> CreateDeviceCodec(
    const CodecSpec& /*spec*/) {
  return absl::UnavailableError(kNoCuda);
}

std::string ComputeDevice() { return "cpu"; }

absl::Status CopyDeviceToHost(int /*device_id*/, const void* /*device*/,
                              absl::Span<char> /*host*/) {
  return absl::UnavailableError(kNoCuda);
}

absl::Status CopyHostToDevice(int /*device_id*/,
                              absl::Span<const char> /*host*/,
                              void* /*device*/) {
  return absl::UnavailableError(kNoCuda);
}

absl::StatusOr<uint64_t> CountNonfiniteOnDevice(int /*device_id*/,
                                                const float* /*values*/,
                                                size_t /*n*/) {
  return absl::UnavailableError(kNoCuda);
}

}  // namespace gradcomp::service
