// Prints the tables of docs/codecs.md "Polar-code lossy coding": the Hamming
// distortion of PolarCode on uniform random bits (against the seed's table
// and the bound), D(r/16) at N = 2048 for PolarAllocation, and the relative
// L2 error against bits per value of polar, QSGD and top-k on N(0, 1e-3^2)
// gradients.
//   bazel run -c opt //codecs/cpu:polar_rate_distortion_tool
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "codecs/builtin.h"
#include "codecs/cpu/polar_code.h"
#include "codecs/random.h"

namespace gradcomp::codecs {
namespace {

double Distortion(int log2_n, double rate, int draws, size_t bits) {
  const PolarCode code = *PolarCode::Create(log2_n, rate);
  const int n = code.n();
  const PhiloxStream source_rng(21, log2_n, 0, 0),
      rounding_rng(22, log2_n, 0, 0);
  std::vector<float> u(n), uniforms(static_cast<size_t>(draws) * n);
  std::vector<uint8_t> source(n), info(code.k()), approx(n);
  int64_t errors = 0;
  for (size_t block = 0; block < bits / n; ++block) {
    source_rng.FillUniform(block * n, absl::MakeSpan(u));
    for (int i = 0; i < n; ++i) source[i] = u[i] < 0.5f;
    rounding_rng.FillUniform(block * draws * n, absl::MakeSpan(uniforms));
    errors += code.Encode(source, uniforms, absl::MakeSpan(info),
                          absl::MakeSpan(approx));
  }
  return static_cast<double>(errors) / static_cast<double>(bits);
}

// Relative L2 error of one encode/decode and the payload's bits per value.
void Report(const std::string& label, const std::string& codec_name,
            const std::map<std::string, std::string>& params,
            const std::vector<float>& g) {
  std::unique_ptr<Codec> codec =
      *BuiltinCodecs().Create(codec_name, CodecParams(params));
  const auto& single = dynamic_cast<const SingleRoundCodec&>(*codec);
  const int64_t shape[] = {static_cast<int64_t>(g.size())};
  TensorState state;
  StepContext ctx;
  ctx.seed = 1;
  Bytes payload;
  if (!single.Encode(TensorView{g, shape}, state, ctx, &payload).ok()) return;
  std::vector<float> out(g.size(), 0.0f);
  if (!single.DecodeAdd(payload, 1.0f, absl::MakeSpan(out)).ok()) return;
  double err = 0, norm = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    err += (double{out[i]} - g[i]) * (double{out[i]} - g[i]);
    norm += double{g[i]} * g[i];
  }
  std::printf("| %s | %.3f | %.4f |\n", label.c_str(),
              8.0 * payload.size() / g.size(), std::sqrt(err / norm));
}

void Main() {
  std::printf("| N | draws | R=0.1 | R=0.3 | R=0.5 | R=0.7 | R=0.9 |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- |\n");
  for (int log2_n : {8, 11}) {
    for (int draws : {1, 4, 8}) {
      std::printf("| %d | %d |", 1 << log2_n, draws);
      for (double r : {0.1, 0.3, 0.5, 0.7, 0.9}) {
        std::printf(" %.4f |", Distortion(log2_n, r, draws, size_t{1} << 20));
      }
      std::printf("\n");
    }
  }
  std::printf("| bound | |");
  for (double r : {0.1, 0.3, 0.5, 0.7, 0.9}) {
    std::printf(" %.4f |", InverseBinaryEntropy(1 - r));
  }
  std::printf("\n\nD(r/16), N = 2048, 4 draws, r = 0..16:\n0.5");
  for (int r = 1; r < 16; ++r) {
    std::printf(", %.4f", Distortion(11, r / 16.0, 4, size_t{1} << 20));
  }
  std::printf(", 0.0\n\n| codec | bits/value | relative L2 error |\n");
  std::printf("| --- | --- | --- |\n");
  std::mt19937 gen(5);
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  std::vector<float> g(1 << 18);
  for (float& v : g) v = normal(gen);
  Report("polar seed", "polar", {{"mode", "seed"}}, g);
  for (const char* b : {"1.5", "2", "2.5", "3", "4", "5", "6", "8"}) {
    Report(std::string("polar planes ") + b, "polar", {{"bits_per_value", b}},
           g);
  }
  for (const char* b : {"2", "3", "4", "8"}) {
    Report(std::string("qsgd ") + b, "qsgd", {{"bits", b}}, g);
  }
  for (const char* name : {"signsgd", "efsign"}) {
    Report(name, name, {}, g);
  }
  for (const char* ratio : {"0.01", "0.03", "0.1", "0.3"}) {
    Report(std::string("topk ") + ratio, "topk", {{"ratio", ratio}}, g);
  }
}

}  // namespace
}  // namespace gradcomp::codecs

int main() { gradcomp::codecs::Main(); }
