#include "codecs/cuda/gpu_test_util.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "codecs/cuda/device.h"

namespace gradcomp::codecs::cuda {

void GpuTest::SetUp() {
  const absl::Status gpu = CudaDeviceAvailable();
  if (!gpu.ok()) GTEST_SKIP() << gpu.message();
}

std::string PayloadDiff(const Bytes& cpu, const Bytes& gpu) {
  if (cpu.size() != gpu.size()) {
    return absl::StrFormat("sizes differ: CPU %d bytes, GPU %d", cpu.size(),
                           gpu.size());
  }
  for (size_t i = 0; i < cpu.size(); ++i) {
    if (cpu[i] != gpu[i]) {
      return absl::StrFormat(
          "first difference at byte %d of %d: CPU 0x%02x, GPU 0x%02x", i,
          cpu.size(), static_cast<uint8_t>(cpu[i]),
          static_cast<uint8_t>(gpu[i]));
    }
  }
  return "identical";
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), 4 * a.size()) == 0);
}

absl::StatusOr<std::vector<float>> GpuDecodeAdd(const CudaCodec& codec,
                                                const Bytes& payload,
                                                float alpha,
                                                std::vector<float> acc) {
  const size_t bytes = acc.size() * sizeof(float);
  absl::StatusOr<DeviceBuffer> device = DeviceBuffer::Create(bytes);
  if (!device.ok()) return device.status();
  if (bytes > 0 && cudaMemcpy(device->data(), acc.data(), bytes,
                              cudaMemcpyHostToDevice) != cudaSuccess) {
    return absl::InternalError("cudaMemcpy to the device failed");
  }
  const absl::Status s =
      codec.DecodeAddDevice(payload, alpha, device->as<float>(), acc.size());
  if (!s.ok()) return s;
  if (bytes > 0 && cudaMemcpy(acc.data(), device->data(), bytes,
                              cudaMemcpyDeviceToHost) != cudaSuccess) {
    return absl::InternalError("cudaMemcpy from the device failed");
  }
  return acc;
}

}  // namespace gradcomp::codecs::cuda
