// Runs T steps of `powersgd` for W simulated workers on matrices read from a
// file and writes the averaged outputs, so that powersgd_torch_test.py can
// compare them with PyTorch's powerSGD_hook on the same data.
//
//   powersgd_reference_tool IN OUT
//
// IN (little-endian): int64 W, T, rows, cols, rank; fp32 Q0 (cols x rank,
// the first step's warm start on every worker); fp32 gradients, T x W x
// rows x cols. OUT: fp32 outputs, T x rows x cols (rank 0's, which every
// rank shares). Error feedback and warm start are on; every matrix is
// compressed (min_compression_rate 0).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codecs/cpu/powersgd.h"
#include "codecs/state.h"
#include "codecs/testing/conformance.h"

namespace gradcomp::codecs {
namespace {

int Fail(const std::string& why) {
  std::fprintf(stderr, "powersgd_reference_tool: %s\n", why.c_str());
  return 1;
}

int Run(const char* in_path, const char* out_path) {
  std::ifstream in(in_path, std::ios::binary);
  const std::string data((std::istreambuf_iterator<char>(in)),
                         std::istreambuf_iterator<char>());
  int64_t header[5];
  if (data.size() < sizeof(header)) return Fail("input shorter than header");
  std::memcpy(header, data.data(), sizeof(header));
  const int64_t world = header[0], steps = header[1], rows = header[2],
                cols = header[3], rank = header[4];
  const size_t q_size = static_cast<size_t>(cols * rank);
  const size_t n = static_cast<size_t>(rows * cols);
  const size_t expected =
      sizeof(header) + 4 * (q_size + static_cast<size_t>(steps * world) * n);
  if (data.size() != expected) {
    return Fail(
        absl::StrCat("expected ", expected, " input bytes, got ", data.size()));
  }
  const float* q0 =
      reinterpret_cast<const float*>(data.data() + sizeof(header));
  const float* grads = q0 + q_size;

  PowerSgdOptions options;
  options.rank = rank;
  options.min_compression_rate = 0;
  const PowerSgdCodec codec(options);
  std::vector<TensorState> states(static_cast<size_t>(world));
  for (TensorState& state : states) {
    absl::Span<float> q = state.Buffer(kPowerSgdQBuffer, q_size);
    std::copy(q0, q0 + q_size, q.begin());
  }
  const int64_t shape[] = {rows, cols};
  std::vector<float> outputs;
  for (int64_t t = 0; t < steps; ++t) {
    std::vector<std::vector<float>> step_grads;
    for (int64_t w = 0; w < world; ++w) {
      const float* g = grads + static_cast<size_t>(t * world + w) * n;
      step_grads.emplace_back(g, g + n);
    }
    StepContext ctx;
    ctx.step = t;
    absl::StatusOr<testing::SimulatedStep> step =
        testing::SimulateStep(codec, step_grads, shape, states, ctx);
    if (!step.ok()) return Fail(std::string(step.status().message()));
    outputs.insert(outputs.end(), step->out[0].begin(), step->out[0].end());
  }
  std::ofstream out(out_path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(outputs.data()),
            static_cast<std::streamsize>(outputs.size() * sizeof(float)));
  return out.good() ? 0 : Fail(absl::StrCat("cannot write ", out_path));
}

}  // namespace
}  // namespace gradcomp::codecs

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s IN OUT\n", argv[0]);
    return 2;
  }
  return gradcomp::codecs::Run(argv[1], argv[2]);
}
