// Command-line parsing for gradcompctl, kept apart from main() so that it can
// be tested. Flags take "--flag=value" or "--flag value" and may appear before
// or after the subcommand:
//
//   absl::StatusOr<CtlArgs> args = ParseCtlArgs({"reduce", "--input=g.npy",
//       "--tensor=fc.weight", "--step=3", "--codec=topk",
//       "--param=ratio=0.01"});
//
// Errors name the offending flag and say what was expected.
#ifndef GRADCOMP_CLIENT_CPP_CTL_ARGS_H_
#define GRADCOMP_CLIENT_CPP_CTL_ARGS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/cpp/npy.h"
#include "gradcomp/v1/gradcomp.pb.h"

namespace gradcomp::client {

enum class CtlCommand {
  kHelp,
  kInfo,
  kPolicy,
  kReduce,
  kBench,
  kExportState,
  kImportState,
  kRelease,
};

struct CtlArgs {
  CtlCommand command = CtlCommand::kHelp;
  std::string target;
  absl::Duration timeout = absl::Seconds(300);
  std::string job = "default";
  // Unset: the daemon's policy decides.
  std::optional<v1::CodecSpec> codec;

  // policy
  std::string policy_file;  // --set: a gradcomp.v1.Policy in text or JSON
  std::optional<int64_t> from_step;  // --from_step: the step it starts at

  // reduce: .npy, or raw little-endian bytes with --shape; export-state and
  // import-state: the state blob
  std::string input;
  std::string output;  // reduce: .npy; empty: not written
  std::string tensor;
  int64_t step = 0;
  std::optional<std::vector<int64_t>> shape;  // for raw input
  std::optional<NpyDType> raw_dtype;          // for raw input; float32 if unset

  // bench
  int64_t numel = 0;
  int64_t iters = 20;
  uint64_t seed = 1;
};

// The target when no --target is given: `environment` ($GRADCOMP_TARGET,
// null when unset) unless it is unset or empty, else kDefaultTarget.
std::string DefaultCtlTarget(const char* environment);

// Parses argv without the program name. `default_target` is used when no
// --target is given (main passes DefaultCtlTarget).
absl::StatusOr<CtlArgs> ParseCtlArgs(const std::vector<std::string>& args,
                                     const std::string& default_target);

// The --help text.
std::string CtlUsage();

}  // namespace gradcomp::client

#endif  // GRADCOMP_CLIENT_CPP_CTL_ARGS_H_
