// Prints the tables of docs/codecs.md "Polar-code lossy coding": the Hamming
// distortion of PolarCode on uniform random bits (against the seed's table
// and the bound), D(r/16) at N = 2048 for PolarAllocation, and the relative
// L2 error against bits per value of polar, QSGD and top-k on N(0, 1e-3^2)
// gradients, with PowerSGD, random-k and threshold beside them.
//   bazel run //codecs/cpu:polar_rate_distortion_tool   # -O3 via OPT_COPTS
// With --csv it prints only the error-against-bits rows, as CSV
// (family,label,bits_per_value,relative_l2_error), for
// docs/plots/error_vs_bits.py.
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "codecs/builtin.h"
#include "codecs/codec.h"
#include "codecs/cpu/polar_code.h"
#include "codecs/random.h"
#include "codecs/state.h"
#include "codecs/wire.h"

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

bool csv = false;

double RelativeError(const std::vector<float>& out,
                     const std::vector<float>& g) {
  double err = 0, norm = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    err += (double{out[i]} - g[i]) * (double{out[i]} - g[i]);
    norm += double{g[i]} * g[i];
  }
  return std::sqrt(err / norm);
}

void PrintRow(const std::string& family, const std::string& label, double bits,
              double error) {
  if (csv) {
    std::printf("%s,%s,%.4f,%.6g\n", family.c_str(), label.c_str(), bits,
                error);
  } else {
    std::printf("| %s | %.3f | %.4f |\n", label.c_str(), bits, error);
  }
}

// One worker's whole step of a multi-round codec (PowerSGD) on g seen as a
// rows x cols matrix; bits count every round's payload.
void ReportMatrix(const std::string& family, const std::string& label,
                  const std::string& codec_name,
                  const std::map<std::string, std::string>& params,
                  const std::vector<float>& g, int64_t rows) {
  std::unique_ptr<Codec> codec =
      *BuiltinCodecs().Create(codec_name, CodecParams(params));
  const int64_t shape[] = {rows, static_cast<int64_t>(g.size()) / rows};
  TensorState state;
  StepContext ctx;
  ctx.seed = 1;
  auto session = codec->Start(TensorView{g, shape}, state, ctx);
  if (!session.ok()) return;
  size_t payload_bytes = 0;
  while (true) {
    auto round = (*session)->NextRound();
    if (!round.ok()) return;
    if (!round->has_value()) break;
    payload_bytes += (*round)->payload.size();
    RoundResult result;
    if ((*round)->collective == Collective::kSum) {
      auto parsed = PeekPayload((*round)->payload);
      if (!parsed.ok()) return;
      result.sum.assign(parsed->body.size() / sizeof(float), 0.0f);
      if (!AddDenseBody(*parsed, 1.0f, absl::MakeSpan(result.sum)).ok()) {
        return;
      }
    } else {
      result.payloads.push_back(std::move((*round)->payload));
    }
    if (!(*session)->Absorb(std::move(result)).ok()) return;
  }
  std::vector<float> out(g.size(), 0.0f);
  if (!(*session)->Finish(absl::MakeSpan(out)).ok()) return;
  PrintRow(family, label, 8.0 * payload_bytes / g.size(),
           RelativeError(out, g));
}

// Relative L2 error of one encode/decode and the payload's bits per value.
void Report(const std::string& family, const std::string& label,
            const std::string& codec_name,
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
  PrintRow(family, label, 8.0 * payload.size() / g.size(),
           RelativeError(out, g));
}

void ErrorAgainstBits() {
  std::mt19937 gen(5);
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  std::vector<float> g(1 << 18);
  for (float& v : g) v = normal(gen);
  Report("polar seed", "polar seed", "polar", {{"mode", "seed"}}, g);
  for (const char* b : {"1.5", "2", "2.5", "3", "4", "5", "6", "8"}) {
    Report("polar", std::string("polar planes ") + b, "polar",
           {{"bits_per_value", b}}, g);
  }
  for (const char* b : {"2", "3", "4", "8"}) {
    Report("qsgd", std::string("qsgd ") + b, "qsgd", {{"bits", b}}, g);
  }
  Report("sign", "signsgd", "signsgd", {}, g);
  Report("sign", "efsign (first step)", "efsign", {}, g);
  for (const char* ratio : {"0.01", "0.03", "0.1", "0.3"}) {
    Report("topk", std::string("topk ") + ratio, "topk", {{"ratio", ratio}}, g);
  }
  // The same 2^18 values as a 512 x 512 matrix; one step from a random Q.
  for (const char* rank : {"1", "2", "4", "8", "16", "32", "64"}) {
    ReportMatrix("powersgd", std::string("powersgd rank ") + rank, "powersgd",
                 {{"rank", rank}}, g, 512);
  }
  for (const char* ratio : {"0.01", "0.03", "0.1", "0.3"}) {
    Report("randomk", std::string("randomk ") + ratio + " (scaled)", "randomk",
           {{"ratio", ratio}}, g);
  }
  for (const char* ratio : {"0.01", "0.03", "0.1", "0.3"}) {
    Report("randomk unscaled", std::string("randomk ") + ratio + " unscaled",
           "randomk", {{"ratio", ratio}, {"scale", "false"}}, g);
  }
  for (const char* tau : {"3", "2.5", "2", "1.5", "1", "0.5"}) {
    Report("threshold", std::string("threshold tau_rms ") + tau, "threshold",
           {{"tau_rms", tau}}, g);
  }
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
  ErrorAgainstBits();
}

}  // namespace
}  // namespace gradcomp::codecs

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--csv") {
    gradcomp::codecs::csv = true;
    std::printf("family,label,bits_per_value,relative_l2_error\n");
    gradcomp::codecs::ErrorAgainstBits();
    return 0;
  }
  gradcomp::codecs::Main();
}
