// GPU encode and decode throughput of the CUDA kernels (codecs/cuda/
// kernels.h, decode.h) on 25M and 100M floats, as a fraction of the device's
// measured copy bandwidth. Device memory to device memory: the payload's
// copies between host and device are not timed. A decode reads the body and
// the accumulator and writes the accumulator. One JSON object per line on
// stdout (bench/cuda_torch_reference.py writes the PyTorch formulations in the
// same form; tools/gpu_test runs both).
//
//   cuda_codec_benchmark [n ...]    (default: 25000000 100000000)
#include <cuda_runtime_api.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/cuda_timer.h"
#include "codecs/cpu/randomk.h"
#include "codecs/cuda/decode.h"
#include "codecs/cuda/device.h"
#include "codecs/cuda/kernels.h"
#include "codecs/cuda/onebit_kernels.h"
#include "codecs/cuda/randomk_kernels.h"
#include "codecs/cuda/segment_sums.h"
#include "codecs/cuda/select.h"
#include "codecs/cuda/sign_kernels.h"
#include "codecs/cuda/terngrad_kernels.h"
#include "codecs/random.h"

namespace gradcomp::codecs::cuda {
namespace {

constexpr int kWarmup = 3;
constexpr int kReps = 20;

void Check(cudaError_t error, const char* what) {
  if (error != cudaSuccess) {
    std::fprintf(stderr, "cuda_codec_benchmark: %s: %s\n", what,
                 cudaGetErrorString(error));
    std::exit(1);
  }
}

// Mean milliseconds of `launch` over kReps, timed with CUDA events.
double TimeMs(const std::function<cudaError_t()>& launch) {
  const absl::StatusOr<double> ms = bench::TimeCudaMs(
      [&] { return CudaStatus(launch(), "launch"); }, kWarmup, kReps);
  if (!ms.ok()) {
    std::fprintf(stderr, "cuda_codec_benchmark: %s\n",
                 std::string(ms.status().message()).c_str());
    std::exit(1);
  }
  return *ms;
}

void Report(const char* op, size_t n, double ms, double bytes_moved,
            double copy_gbps) {
  const double gbps = bytes_moved / (ms * 1e6);
  std::printf(
      "{\"impl\": \"gradcomp-cuda\", \"op\": \"%s\", \"n\": %zu, \"ms\": %.4f, "
      "\"bytes_moved\": %.0f, \"gbps\": %.1f, \"fraction_of_copy\": %.3f}\n",
      op, n, ms, bytes_moved, gbps, copy_gbps > 0 ? gbps / copy_gbps : 1.0);
  std::fflush(stdout);
}

// The sign, TernGrad and random-k kernels (codecs/cuda/sign_kernels.h,
// terngrad_kernels.h, randomk_kernels.h): signsgd's pack and its sums,
// TernGrad (bucket 512, clip 2.5 sigma: sum of squares, bucket maxima,
// codes), random-k at ratio 0.01 (the gather from drawn indices; the host's
// index draw timed on its own). Bytes moved count the input read once and
// the payload written; scratch (per-block sums, maxima) is not counted.
void RunSinglePass(size_t n, const float* x, void* out, float* acc, int* flag,
                   double copy_gbps) {
  const double in_bytes = 4.0 * n;
  const double acc_bytes = 8.0 * n;
  const size_t sign_bytes = 8 * ((n + 63) / 64);
  const size_t blocks = (n + 63) / 64;
  absl::StatusOr<DeviceBuffer> scratch =
      DeviceBuffer::Create(sizeof(double) * (blocks + 1));
  absl::StatusOr<DeviceBuffer> sums = DeviceBuffer::Create(sizeof(double));
  if (!scratch.ok() || !sums.ok()) {
    std::fprintf(stderr, "cuda_codec_benchmark: cannot allocate scratch\n");
    std::exit(1);
  }
  double* block_sums = scratch->as<double>();
  char* body = static_cast<char*>(out);
  Report("signsgd_encode", n, TimeMs([&] {
           const cudaError_t error =
               LaunchSignPack(x, n, body + 4, block_sums, nullptr);
           if (error != cudaSuccess) return error;
           return LaunchSegmentSums(block_sums, blocks, blocks,
                                    sums->as<double>(), nullptr);
         }),
         in_bytes + sign_bytes + 4.0, copy_gbps);
  const float one = 0.01f;
  Check(cudaMemcpy(body, &one, sizeof(one), cudaMemcpyHostToDevice),
        "scale upload");
  Report("signsgd_decode", n, TimeMs([&] {
           return LaunchSignDecodeAdd(reinterpret_cast<const float*>(body),
                                      body + 4, n, n, 0.25f, acc, nullptr);
         }),
         4.0 + sign_bytes + acc_bytes, copy_gbps);

  const size_t bucket = 512;
  const size_t buckets = (n + bucket - 1) / bucket;
  const size_t terms = n / 256 + 1;
  absl::StatusOr<DeviceBuffer> max_bits =
      DeviceBuffer::Create(sizeof(uint32_t) * buckets);
  if (!max_bits.ok()) std::exit(1);
  const PhiloxWords rng{{5, 0, 77}, {1234, 99}};
  float* scales = static_cast<float*>(out);
  uint8_t* codes = static_cast<uint8_t*>(out) + 4 * buckets;
  Report("terngrad_encode", n, TimeMs([&] {
           cudaError_t error =
               LaunchSumOfSquaresTerms(x, n, block_sums, nullptr);
           if (error != cudaSuccess) return error;
           error = LaunchSegmentSums(block_sums, terms, terms,
                                     sums->as<double>(), nullptr);
           if (error != cudaSuccess) return error;
           // CudaTernGrad takes the clip from the sum on the host (clip_sigma
           // 2.5): the copy waits for the sum before the encode can start.
           double sum = 0;
           error = cudaMemcpy(&sum, sums->as<double>(), sizeof(sum),
                              cudaMemcpyDeviceToHost);
           if (error != cudaSuccess) return error;
           const float clip = static_cast<float>(2.5 * std::sqrt(sum / n));
           return LaunchTernGradEncode(x, n, bucket, clip, rng,
                                       max_bits->as<uint32_t>(), scales, codes,
                                       flag, nullptr);
         }),
         in_bytes + 4.0 * buckets + (n + 3) / 4.0, copy_gbps);
  // clip_sigma 0: no sum of squares, one pass.
  Report("terngrad_noclip_encode", n, TimeMs([&] {
           return LaunchTernGradEncode(
               x, n, bucket, std::numeric_limits<float>::infinity(), rng,
               max_bits->as<uint32_t>(), scales, codes, flag, nullptr);
         }),
         in_bytes + 4.0 * buckets + (n + 3) / 4.0, copy_gbps);
  Report("terngrad_decode", n, TimeMs([&] {
           return LaunchTernGradDecodeAdd(scales, codes, n, bucket, 0.25f, acc,
                                          nullptr);
         }),
         4.0 * buckets + (n + 3) / 4.0 + acc_bytes, copy_gbps);

  // 1-bit SGD: the column sums (one chain per column or lane, in the CPU's
  // order) and the sign pack, as [n / 1000, 1000] (wide: a thread per
  // column) and as a 1-D tensor (narrow: lanes of 64, chunks of 2^16); the
  // input is read twice.
  for (const size_t columns : {size_t{1000}, size_t{1}}) {
    if (n % columns != 0) continue;
    absl::StatusOr<DeviceBuffer> column_sums =
        DeviceBuffer::Create(3 * sizeof(double) * columns);
    absl::StatusOr<DeviceBuffer> lanes =
        DeviceBuffer::Create(sizeof(double) * OneBitScratchDoubles(n, columns));
    if (!column_sums.ok() || !lanes.ok()) std::exit(1);
    const std::string op = "onebit_" + std::to_string(columns) + "col_encode";
    Report(op.c_str(), n, TimeMs([&] {
             const cudaError_t error =
                 LaunchOneBitColumnSums(x, n, columns, lanes->as<double>(),
                                        column_sums->as<double>(), nullptr);
             if (error != cudaSuccess) return error;
             return LaunchSignPack(x, n, body + 8 * columns, block_sums,
                                   nullptr);
           }),
           in_bytes + 8.0 * columns + sign_bytes, copy_gbps);
    const std::string decode_op =
        "onebit_" + std::to_string(columns) + "col_decode";
    Report(decode_op.c_str(), n, TimeMs([&] {
             return LaunchOneBitDecodeAdd(
                 reinterpret_cast<const float*>(body),
                 reinterpret_cast<const float*>(body) + columns, columns,
                 body + 8 * columns, n, acc, nullptr);
           }),
           8.0 * columns + sign_bytes + acc_bytes, copy_gbps);
  }

  const uint64_t k = (n + 99) / 100;
  const auto draw_start = std::chrono::steady_clock::now();
  const std::vector<uint64_t> bitmap =
      DrawRandomKBitmap(n, k, PhiloxStream(1234, 77, 5, /*round=*/0));
  std::vector<uint32_t> indices;
  indices.reserve(k);
  for (size_t w = 0; w < bitmap.size(); ++w) {
    for (uint64_t word = bitmap[w]; word != 0; word &= word - 1) {
      indices.push_back(static_cast<uint32_t>(w * 64 + __builtin_ctzll(word)));
    }
  }
  const double draw_ms = std::chrono::duration<double, std::milli>(
                             std::chrono::steady_clock::now() - draw_start)
                             .count();
  Report("randomk_0.01_host_draw", n, draw_ms, 4.0 * k, copy_gbps);
  absl::StatusOr<DeviceBuffer> device_indices =
      DeviceBuffer::Create(sizeof(uint32_t) * k);
  if (!device_indices.ok()) std::exit(1);
  Check(cudaMemcpy(device_indices->data(), indices.data(), sizeof(uint32_t) * k,
                   cudaMemcpyHostToDevice),
        "index upload");
  const uint32_t* idx = device_indices->as<uint32_t>();
  float* values = static_cast<float*>(out);
  Report("randomk_0.01_encode", n, TimeMs([&] {
           return LaunchRandomKGather(x, idx, k, 100.0f, values, nullptr);
         }),
         12.0 * k, copy_gbps);
  Report("randomk_0.01_decode", n, TimeMs([&] {
           return LaunchScatterAdd(idx, values, k, 0.25f, acc, nullptr);
         }),
         16.0 * k, copy_gbps);
}

void Run(size_t n) {
  std::vector<float> host(n);
  std::mt19937 gen(42);
  std::normal_distribution<float> dist(0.0f, 0.01f);
  for (float& x : host) x = dist(gen);
  // Large enough for every body: the fp32 copy (4n) is the largest.
  absl::StatusOr<DeviceBuffer> input = DeviceBuffer::Create(4 * n);
  absl::StatusOr<DeviceBuffer> output = DeviceBuffer::Create(4 * n + 4096);
  absl::StatusOr<DeviceBuffer> nonfinite = DeviceBuffer::Create(sizeof(int));
  absl::StatusOr<DeviceBuffer> accumulator = DeviceBuffer::Create(4 * n);
  if (!input.ok() || !output.ok() || !nonfinite.ok() || !accumulator.ok()) {
    std::fprintf(stderr, "cuda_codec_benchmark: cannot allocate %zu floats\n",
                 n);
    std::exit(1);
  }
  float* x = input->as<float>();
  void* out = output->data();
  int* flag = nonfinite->as<int>();
  float* acc = accumulator->as<float>();
  Check(cudaMemcpy(x, host.data(), 4 * n, cudaMemcpyHostToDevice), "upload");
  Check(cudaMemset(acc, 0, 4 * n), "cudaMemset");
  // Bytes a decode moves besides its body: the accumulator, read and written.
  const double acc_bytes = 8.0 * n;

  const double in_bytes = 4.0 * n;
  const double copy_ms = TimeMs([&] {
    return cudaMemcpyAsync(out, x, 4 * n, cudaMemcpyDeviceToDevice, nullptr);
  });
  const double copy_gbps = 2 * in_bytes / (copy_ms * 1e6);
  Report("copy", n, copy_ms, 2 * in_bytes, copy_gbps);

  Report("fp16_encode", n,
         TimeMs([&] { return LaunchFloatToHalf(x, n, 1.0f, out, nullptr); }),
         in_bytes + 2.0 * n, copy_gbps);
  Report("fp16_decode", n,
         TimeMs([&] { return LaunchAddHalf(out, n, 0.25f, acc, nullptr); }),
         2.0 * n + acc_bytes, copy_gbps);
  Report("bf16_encode", n,
         TimeMs([&] { return LaunchFloatToBf16(x, n, 1.0f, out, nullptr); }),
         in_bytes + 2.0 * n, copy_gbps);
  Report("bf16_decode", n,
         TimeMs([&] { return LaunchAddBf16(out, n, 0.25f, acc, nullptr); }),
         2.0 * n + acc_bytes, copy_gbps);
  Report("none_decode", n,
         TimeMs([&] { return LaunchAddFloat(x, n, 0.25f, acc, nullptr); }),
         in_bytes + acc_bytes, copy_gbps);

  const size_t bucket = 1024;
  const size_t buckets = (n + bucket - 1) / bucket;
  const PhiloxWords rng{{5, 0, 77}, {1234, 99}};
  uint8_t* int8_codes = static_cast<uint8_t*>(out) + 8 * buckets;
  Report("int8_encode", n, TimeMs([&] {
           return LaunchInt8Encode(x, n, bucket, nullptr, out, int8_codes, flag,
                                   nullptr);
         }),
         in_bytes + 8.0 * buckets + n, copy_gbps);
  Report("int8_stochastic_encode", n, TimeMs([&] {
           return LaunchInt8Encode(x, n, bucket, &rng, out, int8_codes, flag,
                                   nullptr);
         }),
         in_bytes + 8.0 * buckets + n, copy_gbps);
  Report("int8_decode", n, TimeMs([&] {
           return LaunchInt8DecodeAdd(out, int8_codes, n, bucket, 0.25f, acc,
                                      nullptr);
         }),
         8.0 * buckets + n + acc_bytes, copy_gbps);

  for (int bits : {2, 4, 8}) {
    const size_t qbucket = 512;
    const size_t qbuckets = (n + qbucket - 1) / qbucket;
    uint8_t* codes = static_cast<uint8_t*>(out) + 4 * qbuckets;
    const std::string op = "qsgd" + std::to_string(bits) + "_encode";
    // The input is read once: buckets of 512 take the one-pass kernel.
    Report(op.c_str(), n, TimeMs([&] {
             return LaunchQsgdEncode(x, n, qbucket, bits, rng, out, codes, flag,
                                     nullptr);
           }),
           in_bytes + 4.0 * qbuckets + (n * bits + 7) / 8.0, copy_gbps);
    const std::string decode_op = "qsgd" + std::to_string(bits) + "_decode";
    Report(decode_op.c_str(), n, TimeMs([&] {
             return LaunchQsgdDecodeAdd(out, codes, n, qbucket, bits, 0.25f,
                                        acc, nullptr);
           }),
           4.0 * qbuckets + (n * bits + 7) / 8.0 + acc_bytes, copy_gbps);
  }

  RunSinglePass(n, x, out, acc, flag, copy_gbps);

  // DGC top-k selection (codecs/cuda/select.h) at the codec's defaults
  // (ratio 0.001, sample 0.01), indices copied to the host included; beside
  // torch.topk(x.abs(), k) in bench/cuda_torch_reference.py.
  const size_t k = n / 1000 > 0 ? n / 1000 : 1;
  const PhiloxStream stream(1234, 77, 5, /*round=*/0);
  Report("topk_0.001", n, TimeMs([&] {
           return SelectTopKDevice(x, n, k, 0.01, stream).ok()
                      ? cudaSuccess
                      : cudaErrorUnknown;
         }),
         in_bytes + 8.0 * k, copy_gbps);
}

}  // namespace
}  // namespace gradcomp::codecs::cuda

int main(int argc, char** argv) {
  const absl::Status gpu = gradcomp::codecs::cuda::CudaDeviceAvailable();
  if (!gpu.ok()) {
    std::fprintf(stderr, "cuda_codec_benchmark: %s\n",
                 std::string(gpu.message()).c_str());
    return 2;
  }
  std::vector<size_t> sizes;
  for (int i = 1; i < argc; ++i)
    sizes.push_back(std::strtoull(argv[i], nullptr, 10));
  if (sizes.empty()) sizes = {25000000, 100000000};
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
    std::printf("{\"impl\": \"gradcomp-cuda\", \"device\": \"%s\"}\n",
                prop.name);
  }
  for (size_t n : sizes) gradcomp::codecs::cuda::Run(n);
  return 0;
}
