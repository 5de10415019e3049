// Steady-state cost of the threaded codecs on 25M floats, as wall time and
// as the CPU time of all the process's threads: on a shared machine the
// wall time follows the other load, the CPU time much less. Complements
// //bench:codec_benchmark, whose CPU column counts the main thread only.
//
//   bazel build //bench:codec_step_cpu
//   bazel-bin/bench/codec_step_cpu [steps]    # default 5 timed steps
//
// Each case runs one untimed step first (state allocation), then `steps`
// timed ones; it prints the best wall time and the mean CPU time, and a
// hash of the last payload, so that two builds can be checked to produce
// the same bytes.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "codecs/builtin.h"
#include "codecs/codec.h"
#include "codecs/state.h"
#include "codecs/wire.h"

namespace gradcomp::codecs {
namespace {

constexpr size_t kNumel = 25'000'000;

double CpuSeconds() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

double WallSeconds() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void Die(const absl::Status& status) {
  if (status.ok()) return;
  std::fprintf(stderr, "%s\n", status.ToString().c_str());
  std::exit(1);
}

// One worker's step through the session API; a kSum round's sum is its own
// body. Returns the last round's payload.
Bytes Step(const Codec& codec, const std::vector<float>& g,
           const std::vector<int64_t>& shape, TensorState& state,
           const StepContext& ctx, std::vector<float>& out) {
  auto session = codec.Start(TensorView{g, shape}, state, ctx);
  Die(session.status());
  Bytes last;
  while (true) {
    auto round = (*session)->NextRound();
    Die(round.status());
    if (!round->has_value()) break;
    RoundResult result;
    if ((*round)->collective == Collective::kSum) {
      auto parsed = PeekPayload((*round)->payload);
      Die(parsed.status());
      result.sum.assign(parsed->body.size() / sizeof(float), 0.0f);
      Die(AddDenseBody(*parsed, 1.0f, absl::MakeSpan(result.sum)));
    }
    last = (*round)->payload;
    result.payloads.push_back(std::move((*round)->payload));
    Die((*session)->Absorb(std::move(result)));
  }
  Die((*session)->Finish(absl::MakeSpan(out)));
  return last;
}

struct Case {
  const char* label;
  const char* codec;
  std::map<std::string, std::string> params;
  std::vector<int64_t> shape;
  int max_steps;  // timed steps at most
};

void Run(const Case& c, const std::vector<float>& g, int steps) {
  auto codec = BuiltinCodecs().Create(c.codec, CodecParams(c.params));
  Die(codec.status());
  TensorState state;
  StepContext ctx;
  std::vector<float> out(g.size());
  double best_wall = 1e30, cpu = 0;
  Bytes payload;
  for (int s = 0; s <= steps; ++s) {
    const double wall0 = WallSeconds(), cpu0 = CpuSeconds();
    payload = Step(**codec, g, c.shape, state, ctx, out);
    ++ctx.step;
    if (s == 0) continue;
    best_wall = std::min(best_wall, WallSeconds() - wall0);
    cpu += CpuSeconds() - cpu0;
  }
  std::printf("%-44s wall %9.1f ms  cpu %9.1f ms  payload %zu bytes %016zx\n",
              c.label, 1e3 * best_wall, 1e3 * cpu / steps, payload.size(),
              std::hash<std::string>()(payload));
}

}  // namespace
}  // namespace gradcomp::codecs

int main(int argc, char** argv) {
  using gradcomp::codecs::Case;
  using gradcomp::codecs::kNumel;
  const int steps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 5;
  std::mt19937 gen(1);
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  std::vector<float> g(kNumel);
  for (float& v : g) v = normal(gen);
  const int64_t n = static_cast<int64_t>(kNumel);
  const std::vector<Case> cases = {
      {"powersgd rank 2 step, 5000 x 5000", "powersgd", {}, {5000, 5000}, 100},
      {"polar 4 bits (raw planes), encode + decode", "polar", {}, {n}, 100},
      // ~13 s of CPU per step: one timed step.
      {"polar 2.5 bits (one SC-coded plane), enc + dec",
       "polar",
       {{"bits_per_value", "2.5"}},
       {n},
       1},
  };
  for (const Case& c : cases) {
    gradcomp::codecs::Run(c, g, std::min(steps, c.max_steps));
  }
  return 0;
}
