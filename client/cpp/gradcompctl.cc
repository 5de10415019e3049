// gradcompctl: the command-line client of gradcompd (info, policy, reduce a
// file, bench). Run `gradcompctl --help` for usage; see docs/clients.md.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "base/file_bytes.h"
#include "base/status_macros.h"
#include "client/cpp/client.h"
#include "client/cpp/ctl_args.h"
#include "client/cpp/npy.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"

namespace gradcomp::client {
namespace {

v1::DType ToProtoDType(NpyDType dtype) {
  switch (dtype) {
    case NpyDType::kFloat16:
      return v1::DTYPE_FLOAT16;
    case NpyDType::kFloat32:
      return v1::DTYPE_FLOAT32;
    case NpyDType::kFloat64:
      return v1::DTYPE_FLOAT64;
  }
  return v1::DTYPE_UNSPECIFIED;
}

const char* YesNo(bool b) { return b ? "yes" : "no"; }

// raw/wire as "12.3x"; "-" when nothing went on the wire.
std::string Ratio(uint64_t raw, uint64_t wire) {
  if (wire == 0) return "-";
  return absl::StrFormat("%.1fx", static_cast<double>(raw) / wire);
}

std::string CodecLabel(const v1::ReduceStats& stats) {
  if (stats.dense_reason().empty()) return stats.codec();
  return absl::StrCat(stats.codec(), " (dense: ", stats.dense_reason(), ")");
}

void PrintStats(const v1::ReduceStats& s) {
  absl::PrintF("codec            %s\n", CodecLabel(s));
  absl::PrintF("world size       %d\n", s.world_size());
  absl::PrintF("raw bytes        %d\n", s.raw_bytes());
  absl::PrintF("wire bytes       %d\n", s.wire_bytes());
  absl::PrintF("ratio            %s\n", Ratio(s.raw_bytes(), s.wire_bytes()));
  absl::PrintF("relative error   %.6g\n", s.relative_error());
  absl::PrintF("non-finite       %d\n", s.nonfinite_values());
  absl::PrintF("encode           %.3f ms\n",
               1e3 * s.timings().encode_seconds());
  absl::PrintF("collective       %.3f ms\n",
               1e3 * s.timings().collective_seconds());
  absl::PrintF("decode           %.3f ms\n",
               1e3 * s.timings().decode_seconds());
  absl::PrintF("total            %.3f ms\n", 1e3 * s.timings().total_seconds());
}

absl::Status RunInfo(Client& client) {
  GC_ASSIGN_OR_RETURN(v1::GetInfoResponse info, client.GetInfo());
  absl::PrintF("target           %s\n", client.target());
  absl::PrintF("version          %s\n", info.version());
  absl::PrintF("wire format      v%d\n", info.wire_format_version());
  absl::PrintF("rank / world     %d / %d\n", info.rank(), info.world_size());
  absl::PrintF("device           %s\n", info.device());
  absl::PrintF("transports       %s\n", absl::StrJoin(info.transports(), ", "));
  absl::PrintF("policy hash      %s\n", info.policy_hash());
  if (info.has_policy_from_step()) {
    absl::PrintF(
        "policy from      step %d (earlier steps keep the one before)\n",
        info.policy_from_step());
  }
  // std::map orders the flags, so the output is stable.
  const std::map<std::string, std::string> flags(info.flags().begin(),
                                                 info.flags().end());
  std::vector<std::string> flag_words;
  for (const auto& [name, value] : flags) {
    flag_words.push_back(absl::StrCat("--", name, "=", value));
  }
  absl::PrintF("flags            %s\n", absl::StrJoin(flag_words, " "));
  std::string policy;
  google::protobuf::TextFormat::PrintToString(info.policy(), &policy);
  absl::PrintF("\npolicy set last (text format):\n%s", policy);
  absl::PrintF("\neffective config at start (JSON):\n%s\n\n",
               info.config_json());
  absl::PrintF("%-12s %4s  %-16s %-8s %-8s %-8s %6s  %s\n", "codec", "id",
               "family", "summable", "unbiased", "stateful", "rounds",
               "params");
  for (const v1::CodecDescription& c : info.codecs()) {
    absl::PrintF("%-12s %4d  %-16s %-8s %-8s %-8s %6d  %s\n", c.name(),
                 c.wire_id(), c.family(), YesNo(c.summable()),
                 YesNo(c.unbiased()), YesNo(c.stateful()), c.rounds(),
                 absl::StrJoin(c.params(), ","));
  }
  return absl::OkStatus();
}

absl::Status RunPolicy(Client& client, const CtlArgs& args) {
  if (!args.policy_file.empty()) {
    GC_ASSIGN_OR_RETURN(std::string text, ReadFileBytes(args.policy_file));
    v1::Policy policy;
    if (absl::EndsWith(args.policy_file, ".json")) {
      auto status = google::protobuf::util::JsonStringToMessage(text, &policy);
      if (!status.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            args.policy_file, ": not a gradcomp.v1.Policy in JSON: ",
            status.message().as_string()));
      }
    } else if (!google::protobuf::TextFormat::ParseFromString(text, &policy)) {
      return absl::InvalidArgumentError(absl::StrCat(
          args.policy_file,
          ": not a gradcomp.v1.Policy in text format (see stderr for where)"));
    }
    GC_ASSIGN_OR_RETURN(std::string hash,
                        client.SetPolicy(policy, args.from_step));
    if (args.from_step) {
      absl::PrintF("policy set from step %d; hash %s\n", *args.from_step, hash);
    } else {
      absl::PrintF("policy set; hash %s\n", hash);
    }
    return absl::OkStatus();
  }
  GC_ASSIGN_OR_RETURN(v1::GetPolicyResponse response, client.GetPolicy());
  std::string text;
  google::protobuf::TextFormat::PrintToString(response.policy(), &text);
  absl::PrintF("# hash %s\n", response.hash());
  if (response.has_from_step()) {
    absl::PrintF(
        "# decides steps >= %d (earlier ones keep the policy before)\n",
        response.from_step());
  }
  absl::PrintF("%s", text);
  return absl::OkStatus();
}

absl::Status RunReduce(Client& client, const CtlArgs& args) {
  NpyArray input;
  if (args.shape) {
    input.dtype = args.raw_dtype.value_or(NpyDType::kFloat32);
    input.shape = *args.shape;
    GC_ASSIGN_OR_RETURN(input.data, ReadFileBytes(args.input));
    GC_ASSIGN_OR_RETURN(const int64_t numel, NumElements(input.shape));
    const uint64_t itemsize = NpyItemSize(input.dtype);
    // numel * itemsize can wrap around (--shape=2^62 of <f4 "needs" 0
    // bytes), and a wrapped size would let a wrong file through.
    if (static_cast<uint64_t>(numel) >
        std::numeric_limits<uint64_t>::max() / itemsize) {
      return absl::InvalidArgumentError(
          absl::StrCat("--shape=", absl::StrJoin(input.shape, ","), " of ",
                       NpyDescr(input.dtype), " has ", numel, " elements of ",
                       itemsize, " bytes: their size does not fit in 64 bits"));
    }
    const uint64_t expected = static_cast<uint64_t>(numel) * itemsize;
    if (input.data.size() != expected) {
      return absl::InvalidArgumentError(
          absl::StrCat(args.input, " is ", input.data.size(),
                       " bytes; --shape=", absl::StrJoin(input.shape, ","),
                       " of ", NpyDescr(input.dtype), " needs ", expected));
    }
  } else {
    GC_ASSIGN_OR_RETURN(input, ReadNpyFile(args.input));
  }
  GC_ASSIGN_OR_RETURN(ReduceResult result,
                      client.ReduceBytes(args.job, args.tensor, args.step,
                                         ToProtoDType(input.dtype), input.data,
                                         input.shape, args.codec));
  absl::PrintF("tensor           %s  shape [%s] %s  step %d\n", args.tensor,
               absl::StrJoin(input.shape, ","), NpyDescr(input.dtype),
               args.step);
  PrintStats(result.stats);
  if (!args.output.empty()) {
    NpyArray output{input.dtype, input.shape, std::move(result.data)};
    GC_RETURN_IF_ERROR(WriteNpyFile(args.output, output));
    absl::PrintF("wrote            %s\n", args.output);
  }
  return absl::OkStatus();
}

// A gradient-like vector: heavy-tailed (Student-t, 4 degrees of freedom)
// values with a per-block scale, so that top-k and quantizers see outliers
// and uneven magnitudes as they do on real gradients.
std::vector<float> SyntheticGradient(int64_t numel, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::student_t_distribution<float> t(4.0f);
  std::lognormal_distribution<float> block_scale(std::log(1e-3f), 0.7f);
  constexpr int64_t kBlock = 4096;
  std::vector<float> values(numel);
  float scale = 0;
  for (int64_t i = 0; i < numel; ++i) {
    if (i % kBlock == 0) scale = block_scale(rng);
    values[i] = scale * t(rng);
  }
  return values;
}

// Nearest-rank percentile of sorted values.
double Percentile(const std::vector<double>& sorted, double p) {
  const size_t rank = static_cast<size_t>(std::ceil(p / 100 * sorted.size()));
  return sorted[std::max<size_t>(rank, 1) - 1];
}

absl::Status RunBench(Client& client, const CtlArgs& args) {
  const std::vector<float> grad = SyntheticGradient(args.numel, args.seed);
  const std::vector<int64_t> shape = {args.numel};
  const std::string tensor = absl::StrCat("bench/", args.numel);
  std::vector<double> latencies;
  double error_sum = 0, encode_sum = 0, decode_sum = 0;
  int64_t error_count = 0;
  uint64_t raw_bytes = 0, wire_bytes = 0;
  std::string codec;
  for (int64_t i = 0; i < args.iters; ++i) {
    const absl::Time start = absl::Now();
    GC_ASSIGN_OR_RETURN(
        Float32ReduceResult result,
        client.Reduce(args.job, tensor, i, grad, shape, args.codec));
    latencies.push_back(absl::ToDoubleSeconds(absl::Now() - start));
    const v1::ReduceStats& s = result.stats;
    codec = CodecLabel(s);
    raw_bytes += s.raw_bytes();
    wire_bytes += s.wire_bytes();
    encode_sum += s.timings().encode_seconds();
    decode_sum += s.timings().decode_seconds();
    if (std::isfinite(s.relative_error())) {
      error_sum += s.relative_error();
      ++error_count;
    }
  }
  std::sort(latencies.begin(), latencies.end());
  const double n = static_cast<double>(args.iters);
  absl::PrintF("codec            %s\n", codec);
  absl::PrintF("numel            %d  (%d iters)\n", args.numel, args.iters);
  absl::PrintF("raw bytes        %.0f per reduce\n", raw_bytes / n);
  absl::PrintF("wire bytes       %.0f per reduce\n", wire_bytes / n);
  absl::PrintF("ratio            %s\n", Ratio(raw_bytes, wire_bytes));
  if (error_count > 0) {
    // Steps reuse one tensor, so error-feedback codecs send accumulated
    // residuals too and their error against the step's input may exceed 1.
    absl::PrintF("relative error   %.6g (mean, vs. each step's input)\n",
                 error_sum / error_count);
  } else {
    absl::PrintF("relative error   n/a (not measured)\n");
  }
  absl::PrintF("encode           %.3f ms (mean)\n", 1e3 * encode_sum / n);
  absl::PrintF("decode           %.3f ms (mean)\n", 1e3 * decode_sum / n);
  absl::PrintF(
      "latency          p50 %.3f ms  p90 %.3f ms  p99 %.3f ms  max %.3f ms\n",
      1e3 * Percentile(latencies, 50), 1e3 * Percentile(latencies, 90),
      1e3 * Percentile(latencies, 99), 1e3 * latencies.back());
  absl::PrintF("throughput       %.1f MB/s raw at p50\n",
               raw_bytes / n / Percentile(latencies, 50) / 1e6);
  return absl::OkStatus();
}

absl::Status RunExportState(Client& client, const CtlArgs& args) {
  GC_ASSIGN_OR_RETURN(const std::string state, client.ExportState(args.job));
  GC_RETURN_IF_ERROR(WriteFileBytes(args.output, state));
  absl::PrintF("exported job '%s': %d bytes of state to %s\n", args.job,
               state.size(), args.output);
  return absl::OkStatus();
}

absl::Status RunImportState(Client& client, const CtlArgs& args) {
  GC_ASSIGN_OR_RETURN(std::string state, ReadFileBytes(args.input));
  const size_t bytes = state.size();
  GC_RETURN_IF_ERROR(client.ImportState(args.job, std::move(state)));
  absl::PrintF("imported %d bytes of state into job '%s'\n", bytes, args.job);
  return absl::OkStatus();
}

absl::Status RunRelease(Client& client, const CtlArgs& args) {
  GC_ASSIGN_OR_RETURN(v1::ReleaseJobResponse released,
                      client.ReleaseJob(args.job));
  absl::PrintF("released job '%s': %d tensors, %d bytes of codec state\n",
               args.job, released.tensors(), released.state_bytes());
  return absl::OkStatus();
}

absl::Status Run(const CtlArgs& args) {
  ClientOptions options;
  options.rpc_timeout = args.timeout;
  GC_ASSIGN_OR_RETURN(std::unique_ptr<Client> client,
                      Client::Connect(args.target, options));
  switch (args.command) {
    case CtlCommand::kInfo:
      return RunInfo(*client);
    case CtlCommand::kPolicy:
      return RunPolicy(*client, args);
    case CtlCommand::kReduce:
      return RunReduce(*client, args);
    case CtlCommand::kBench:
      return RunBench(*client, args);
    case CtlCommand::kExportState:
      return RunExportState(*client, args);
    case CtlCommand::kImportState:
      return RunImportState(*client, args);
    case CtlCommand::kRelease:
      return RunRelease(*client, args);
    case CtlCommand::kHelp:
      break;
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace gradcomp::client

int main(int argc, char** argv) {
  using gradcomp::client::CtlCommand;
  absl::StatusOr<gradcomp::client::CtlArgs> args =
      gradcomp::client::ParseCtlArgs(
          std::vector<std::string>(argv + 1, argv + argc),
          gradcomp::client::DefaultCtlTarget(std::getenv("GRADCOMP_TARGET")));
  if (!args.ok()) {
    std::cerr << "gradcompctl: " << args.status().message()
              << "\n(run gradcompctl --help for usage)\n";
    return 2;
  }
  if (args->command == CtlCommand::kHelp) {
    std::cout << gradcomp::client::CtlUsage();
    return 0;
  }
  absl::Status status = gradcomp::client::Run(*args);
  if (!status.ok()) {
    std::cerr << "gradcompctl: " << status << "\n";
    return 1;
  }
  return 0;
}
