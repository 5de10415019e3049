// CUDA IPC end to end, on a GPU (tag gpu; tools/gpu_test runs it): a client
// process cudaMallocs a gradient, exports it with cudaIpcGetMemHandle and
// hands the handle to the daemon process (this test's parent: CUDA IPC
// handles open only in another process), which registers it over gRPC,
// reduces from and into slices of it, and the client reads the result back
// from its own device memory. It must equal the inline Reduce of the same
// values. Skips (GTEST_SKIP) where no GPU answers.
#include <cuda_runtime_api.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "codecs/builtin.h"
#include "codecs/state.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "service/api/gradcomp_service.h"
#include "service/api/server.h"
#include "service/collective/local_collective.h"
#include "service/memory/shared_memory_registry.h"
#include "service/metrics/metrics.h"

namespace gradcomp::service {
namespace {

constexpr size_t kFloats = 1 << 16;
constexpr size_t kBytes = kFloats * sizeof(float);

std::vector<float> Gradient() {
  std::vector<float> g(kFloats);
  for (size_t i = 0; i < kFloats; ++i) {
    g[i] = std::sin(0.001f * static_cast<float>(i)) * 3.0f;
  }
  return g;
}

bool WriteAll(int fd, const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = write(fd, p, size);
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

bool ReadAll(int fd, void* data, size_t size) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    const ssize_t n = read(fd, p, size);
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

// The client process: the buffer holds the gradient in [0, kBytes) and room
// for the result in [kBytes, 2 * kBytes). Sends 'N' + reason without a GPU,
// else 'Y' + the handle; after the daemon's go-ahead byte, sends the result
// half back. Exits without returning to gtest.
[[noreturn]] void Client(int to_daemon, int from_daemon) {
  int count = 0;
  const cudaError_t probe = cudaGetDeviceCount(&count);
  if (probe != cudaSuccess || count < 1) {
    const std::string why =
        probe != cudaSuccess ? cudaGetErrorString(probe) : "0 devices";
    const uint32_t size = static_cast<uint32_t>(why.size());
    WriteAll(to_daemon, "N", 1);
    WriteAll(to_daemon, &size, sizeof(size));
    WriteAll(to_daemon, why.data(), why.size());
    _exit(0);
  }
  void* buffer = nullptr;
  cudaIpcMemHandle_t handle;
  const std::vector<float> g = Gradient();
  if (cudaMalloc(&buffer, 2 * kBytes) != cudaSuccess ||
      cudaMemset(buffer, 0, 2 * kBytes) != cudaSuccess ||
      cudaMemcpy(buffer, g.data(), kBytes, cudaMemcpyHostToDevice) !=
          cudaSuccess ||
      cudaIpcGetMemHandle(&handle, buffer) != cudaSuccess) {
    _exit(2);
  }
  if (!WriteAll(to_daemon, "Y", 1) ||
      !WriteAll(to_daemon, &handle, sizeof(handle))) {
    _exit(3);
  }
  char go = 0;
  if (!ReadAll(from_daemon, &go, 1)) _exit(4);
  std::vector<float> result(kFloats);
  if (cudaMemcpy(result.data(), static_cast<char*>(buffer) + kBytes, kBytes,
                 cudaMemcpyDeviceToHost) != cudaSuccess) {
    _exit(5);
  }
  _exit(WriteAll(to_daemon, result.data(), kBytes) ? 0 : 6);
}

v1::ReduceRequest Request(const std::string& tensor) {
  v1::ReduceRequest r;
  r.set_job("job");
  r.set_tensor(tensor);
  r.set_step(1);
  r.set_dtype(v1::DTYPE_FLOAT32);
  r.add_shape(static_cast<int64_t>(kFloats));
  r.mutable_codec()->set_name("fp16");
  return r;
}

TEST(CudaShmGpuTest, AClientsCudaBufferReducesLikeTheInlinePath) {
  // Forked before this process touches CUDA or gRPC.
  int up[2], down[2];
  ASSERT_EQ(pipe(up), 0);
  ASSERT_EQ(pipe(down), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) Client(up[1], down[0]);
  close(up[1]);
  close(down[0]);

  char answer = 0;
  ASSERT_TRUE(ReadAll(up[0], &answer, 1)) << "the client process died";
  if (answer == 'N') {
    uint32_t size = 0;
    ASSERT_TRUE(ReadAll(up[0], &size, sizeof(size)));
    std::string why(size, '\0');
    ASSERT_TRUE(ReadAll(up[0], why.data(), size));
    waitpid(pid, nullptr, 0);
    GTEST_SKIP() << "no usable CUDA device: " << why;
  }
  ASSERT_EQ(answer, 'Y');
  std::string handle(sizeof(cudaIpcMemHandle_t), '\0');
  ASSERT_TRUE(ReadAll(up[0], handle.data(), handle.size()));

  codecs::StateStore store;
  Metrics metrics(&store, "test");
  LocalCollective collective;
  auto engine = Engine::Create(EngineOptions(), codecs::BuiltinCodecs(), &store,
                               &collective, &metrics, Policy());
  ASSERT_TRUE(engine.ok()) << engine.status();
  SharedMemoryOptions options;
  options.reclaim_interval = absl::ZeroDuration();
  SharedMemoryRegistry shm(options, &metrics);
  GradcompService service(engine->get(), &metrics, StreamOptions(),
                          DaemonSettings(), &shm);
  int port = 0;
  auto server = StartGrpcServer("127.0.0.1:0", &service, &port, &metrics);
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = v1::Gradcomp::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  auto as_client = [] {
    auto context = std::make_unique<grpc::ClientContext>();
    context->AddMetadata("gradcomp-client-id", "c1");
    return context;
  };

  v1::RegisterCudaSharedMemoryRequest reg;
  reg.set_name("dev");
  reg.set_raw_handle(handle);
  reg.set_device_id(0);
  reg.set_byte_size(2 * kBytes);
  v1::RegisterCudaSharedMemoryResponse registered;
  const grpc::Status opened =
      stub->RegisterCudaSharedMemory(as_client().get(), reg, &registered);
  ASSERT_TRUE(opened.ok()) << opened.error_message();

  // Past the exported allocation: refused.
  v1::RegisterCudaSharedMemoryRequest too_big = reg;
  too_big.set_name("too_big");
  too_big.set_byte_size(64 * kBytes);
  EXPECT_EQ(
      stub->RegisterCudaSharedMemory(as_client().get(), too_big, &registered)
          .error_code(),
      grpc::StatusCode::INVALID_ARGUMENT);

  v1::SharedMemoryStatusRequest status_request;
  v1::SharedMemoryStatusResponse status;
  ASSERT_TRUE(
      stub->SharedMemoryStatus(as_client().get(), status_request, &status)
          .ok());
  ASSERT_EQ(status.regions_size(), 1);
  EXPECT_EQ(status.regions(0).kind(), "cuda");
  EXPECT_EQ(status.regions(0).byte_size(), 2 * kBytes);

  v1::ReduceRequest on_device = Request("fc.cuda");
  on_device.mutable_input_shm()->set_region("dev");
  on_device.mutable_input_shm()->set_byte_size(kBytes);
  on_device.mutable_output_shm()->set_region("dev");
  on_device.mutable_output_shm()->set_offset(kBytes);
  on_device.mutable_output_shm()->set_byte_size(kBytes);
  v1::ReduceResponse device_response;
  const grpc::Status reduced =
      stub->Reduce(as_client().get(), on_device, &device_response);
  ASSERT_TRUE(reduced.ok()) << reduced.error_message();

  // A slice past the region's end is refused like a system region's.
  v1::ReduceRequest past_end = on_device;
  past_end.set_tensor("fc.past_end");
  past_end.mutable_output_shm()->set_offset(kBytes + 4);
  v1::ReduceResponse refused;
  EXPECT_EQ(stub->Reduce(as_client().get(), past_end, &refused).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);

  const std::vector<float> g = Gradient();
  v1::ReduceRequest inline_request = Request("fc.inline");
  inline_request.set_data(
      std::string(reinterpret_cast<const char*>(g.data()), kBytes));
  v1::ReduceResponse inline_response;
  ASSERT_TRUE(
      stub->Reduce(as_client().get(), inline_request, &inline_response).ok());
  ASSERT_EQ(inline_response.data().size(), kBytes);

  ASSERT_TRUE(WriteAll(down[1], "g", 1));
  std::vector<float> from_device(kFloats);
  ASSERT_TRUE(ReadAll(up[0], from_device.data(), kBytes));
  int wstatus = 0;
  waitpid(pid, &wstatus, 0);
  EXPECT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) << wstatus;
  EXPECT_EQ(
      std::memcmp(from_device.data(), inline_response.data().data(), kBytes), 0)
      << "the CUDA slice's result differs from the inline path's";
  // fp16 changed the values: the output is the reduce's, not the input.
  EXPECT_NE(std::memcmp(from_device.data(), g.data(), kBytes), 0);

  v1::UnregisterSharedMemoryRequest unregister;
  unregister.set_name("dev");
  v1::UnregisterSharedMemoryResponse unregistered;
  EXPECT_TRUE(
      stub->UnregisterSharedMemory(as_client().get(), unregister, &unregistered)
          .ok());
  (*server)->Shutdown();
}

}  // namespace
}  // namespace gradcomp::service
