// One trainer of the multi-daemon tests, as its own process: reduces every
// workload tensor of steps [first, first + steps) through its own daemon,
// each step's tensors all in flight at once and started in a random order of
// this rank's own, and writes the averages (fp32, step-major, tensor order)
// to a file. On a failed reduce it writes the error to <out>.err, exits 3.
//
//   peer_worker <target> <rank> <job> <codec> <k=v,...|-> <first> <steps>
//               <tensors> <out>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "client/cpp/client.h"
#include "tests/integration/peer_workload.h"

namespace gradcomp::testing {
namespace {

int Main(int argc, char** argv) {
  if (argc != 10) {
    std::fprintf(stderr,
                 "usage: peer_worker <target> <rank> <job> <codec> "
                 "<k=v,...|-> <first> <steps> <tensors> <out>\n");
    return 2;
  }
  const std::string target = argv[1], job = argv[3], codec_name = argv[4],
                    out_path = argv[9];
  int rank = 0, steps = 0, tensors = 0;
  int64_t first = 0;
  if (!absl::SimpleAtoi(argv[2], &rank) || !absl::SimpleAtoi(argv[6], &first) ||
      !absl::SimpleAtoi(argv[7], &steps) ||
      !absl::SimpleAtoi(argv[8], &tensors)) {
    std::fprintf(stderr, "peer_worker: bad number in the arguments\n");
    return 2;
  }
  v1::CodecSpec codec;
  codec.set_name(codec_name);
  if (std::string(argv[5]) != "-") {
    for (absl::string_view kv : absl::StrSplit(argv[5], ',')) {
      std::pair<std::string, std::string> p = absl::StrSplit(kv, '=');
      (*codec.mutable_params())[p.first] = p.second;
    }
  }
  client::ClientOptions options;
  options.rpc_timeout = absl::Seconds(120);
  auto client = client::Client::Connect(target, options);
  if (!client.ok()) return 2;
  // One refused first connection would fail every call made on it at once
  // (DaemonProcess::Connect says when); wait for the channel instead.
  if (!(*client)->WaitForReady(absl::Seconds(30)).ok()) return 2;

  std::ofstream out(out_path, std::ios::binary);
  std::mt19937 rng(1234 + rank);
  for (int64_t step = first; step < first + steps; ++step) {
    std::vector<int> order(tensors);
    for (int t = 0; t < tensors; ++t) order[t] = t;
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<absl::StatusOr<client::Float32ReduceResult>> results(
        tensors, absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    for (int t : order) {
      threads.emplace_back([&, t] {
        const std::vector<float> grad = WorkloadGradient(rank, t, step);
        results[t] = (*client)->Reduce(job, WorkloadTensorName(t), step, grad,
                                       WorkloadShape(t), codec);
      });
    }
    for (std::thread& thread : threads) thread.join();
    for (int t = 0; t < tensors; ++t) {
      if (!results[t].ok()) {
        std::ofstream err(out_path + ".err");
        err << results[t].status().ToString();
        return 3;
      }
      out.write(reinterpret_cast<const char*>(results[t]->values.data()),
                results[t]->values.size() * sizeof(float));
    }
  }
  return out.good() ? 0 : 2;
}

}  // namespace
}  // namespace gradcomp::testing

int main(int argc, char** argv) { return gradcomp::testing::Main(argc, argv); }
