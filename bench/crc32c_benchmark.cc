// Throughput of the peer checksum (base/crc32c.h): the SSE4.2 instruction
// path, the portable table, and a memcpy of the same bytes for scale.
//
//   bazel run -c opt //bench:crc32c_benchmark
#include <cstring>
#include <random>
#include <string>

#include "base/crc32c.h"
#include "benchmark/benchmark.h"

namespace gradcomp {
namespace {

std::string RandomBytes(size_t n) {
  std::mt19937_64 rng(1);
  std::string s(n, '\0');
  for (size_t i = 0; i + 8 <= n; i += 8) {
    const uint64_t v = rng();
    std::memcpy(&s[i], &v, 8);
  }
  return s;
}

template <uint32_t (*Extend)(uint32_t, const void*, size_t)>
void BM_Crc32c(benchmark::State& state) {
  const std::string data = RandomBytes(state.range(0));
  if (Extend == &crc32c_internal::ExtendHardware && !Crc32cUsesHardware()) {
    state.SkipWithError("no SSE4.2 on this CPU");
    return;
  }
  for (auto _ : state) {
    benchmark::DoNotOptimize(Extend(0, data.data(), data.size()));
  }
  state.SetBytesProcessed(state.iterations() * data.size());
}
BENCHMARK_TEMPLATE(BM_Crc32c, crc32c_internal::ExtendHardware)
    ->Arg(64 << 10)
    ->Arg(1 << 20)
    ->Arg(64 << 20);
BENCHMARK_TEMPLATE(BM_Crc32c, crc32c_internal::ExtendPortable)->Arg(1 << 20);

void BM_Memcpy(benchmark::State& state) {
  const std::string data = RandomBytes(state.range(0));
  std::string out(data.size(), '\0');
  for (auto _ : state) {
    std::memcpy(out.data(), data.data(), data.size());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(state.iterations() * data.size());
}
BENCHMARK(BM_Memcpy)->Arg(1 << 20)->Arg(64 << 20);

}  // namespace
}  // namespace gradcomp

BENCHMARK_MAIN();
