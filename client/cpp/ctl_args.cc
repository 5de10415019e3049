#include "client/cpp/ctl_args.h"

#include <cstdint>
#include <functional>
#include <iterator>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/status_macros.h"
#include "client/cpp/client.h"

namespace gradcomp::client {
namespace {

struct CommandName {
  absl::string_view name;
  CtlCommand command;
};
// Help first: errors list the others.
constexpr CommandName kCommands[] = {
    {"help", CtlCommand::kHelp},
    {"info", CtlCommand::kInfo},
    {"policy", CtlCommand::kPolicy},
    {"reduce", CtlCommand::kReduce},
    {"bench", CtlCommand::kBench},
    {"export-state", CtlCommand::kExportState},
    {"import-state", CtlCommand::kImportState},
    {"release", CtlCommand::kRelease},
};

absl::string_view NameOf(CtlCommand command) {
  for (const CommandName& c : kCommands) {
    if (c.command == command) return c.name;
  }
  return "?";
}

// "info, policy, ... or release": the commands an error offers (not help).
std::string ExpectedCommands() {
  std::string list;
  constexpr size_t kLast = std::size(kCommands) - 1;
  for (size_t i = 1; i <= kLast; ++i) {
    absl::StrAppend(&list,
                    i == 1       ? ""
                    : i == kLast ? " or "
                                 : ", ",
                    kCommands[i].name);
  }
  return list;
}

absl::Status FlagError(absl::string_view flag, absl::string_view value,
                       absl::string_view expected) {
  return absl::InvalidArgumentError(
      absl::StrCat("--", flag, "=", value, ": expected ", expected));
}

absl::StatusOr<int64_t> ParseInt(absl::string_view flag,
                                 absl::string_view value, int64_t min) {
  int64_t parsed = 0;
  if (!absl::SimpleAtoi(value, &parsed) || parsed < min) {
    return FlagError(flag, value, absl::StrCat("an integer >= ", min));
  }
  return parsed;
}

absl::StatusOr<std::vector<int64_t>> ParseShape(absl::string_view value) {
  std::vector<int64_t> shape;
  if (value.empty()) return shape;  // a scalar
  for (absl::string_view dim : absl::StrSplit(value, ',')) {
    int64_t parsed = 0;
    if (!absl::SimpleAtoi(dim, &parsed) || parsed < 0) {
      return FlagError("shape", value,
                       "comma-separated non-negative dimensions, e.g. 256,784");
    }
    shape.push_back(parsed);
  }
  return shape;
}

absl::StatusOr<NpyDType> ParseDType(absl::string_view value) {
  if (value == "float32") return NpyDType::kFloat32;
  if (value == "float16") return NpyDType::kFloat16;
  if (value == "float64") return NpyDType::kFloat64;
  return FlagError("dtype", value, "float32, float16 or float64");
}

using FlagSetter = std::function<absl::Status(absl::string_view, CtlArgs&)>;

// One flag: the commands that take it and how it sets its value.
struct FlagSpec {
  absl::string_view name;
  std::vector<CtlCommand> commands;  // empty: every command
  FlagSetter set;
};

// A setter that stores the value as it is.
FlagSetter StoreString(std::string CtlArgs::*member) {
  return [member](absl::string_view v, CtlArgs& a) {
    a.*member = std::string(v);
    return absl::OkStatus();
  };
}

// A setter that parses an integer >= `min`.
FlagSetter StoreInt(absl::string_view flag, int64_t CtlArgs::*member,
                    int64_t min) {
  return [flag, member, min](absl::string_view v, CtlArgs& a) {
    GC_ASSIGN_OR_RETURN(a.*member, ParseInt(flag, v, min));
    return absl::OkStatus();
  };
}

const std::vector<FlagSpec>& Flags() {
  using C = CtlCommand;
  static const auto* flags = new std::vector<FlagSpec>{
      {"target",
       {},
       [](absl::string_view v, CtlArgs& a) {
         if (v.empty())
           return FlagError("target", v, "host:port or unix:/path");
         a.target = std::string(v);
         return absl::OkStatus();
       }},
      {"timeout",
       {},
       [](absl::string_view v, CtlArgs& a) {
         if (!absl::ParseDuration(v, &a.timeout) ||
             a.timeout <= absl::ZeroDuration()) {
           return FlagError("timeout", v, "a positive duration, e.g. 30s");
         }
         return absl::OkStatus();
       }},
      {"job",
       {C::kReduce, C::kBench, C::kExportState, C::kImportState, C::kRelease},
       StoreString(&CtlArgs::job)},
      {"codec",
       {C::kReduce, C::kBench},
       [](absl::string_view v, CtlArgs& a) {
         if (v.empty()) return FlagError("codec", v, "a codec name");
         if (!a.codec) a.codec.emplace();
         a.codec->set_name(std::string(v));
         return absl::OkStatus();
       }},
      {"param",
       {C::kReduce, C::kBench},
       [](absl::string_view v, CtlArgs& a) {
         std::pair<absl::string_view, absl::string_view> kv =
             absl::StrSplit(v, absl::MaxSplits('=', 1));
         if (kv.first.empty() || !absl::StrContains(v, '=')) {
           return FlagError("param", v, "name=value, e.g. ratio=0.01");
         }
         if (!a.codec) a.codec.emplace();
         auto& params = *a.codec->mutable_params();
         if (!params.insert({std::string(kv.first), std::string(kv.second)})
                  .second) {
           return FlagError("param", v,
                            absl::StrCat("each parameter once; '", kv.first,
                                         "' is repeated"));
         }
         return absl::OkStatus();
       }},
      {"set",
       {C::kPolicy},
       [](absl::string_view v, CtlArgs& a) {
         // Empty (--set=$UNSET) would print the policy and exit 0 instead.
         if (v.empty()) return FlagError("set", v, "a policy file");
         a.policy_file = std::string(v);
         return absl::OkStatus();
       }},
      {"from_step",
       {C::kPolicy},
       [](absl::string_view v, CtlArgs& a) {
         GC_ASSIGN_OR_RETURN(a.from_step, ParseInt("from_step", v, 0));
         return absl::OkStatus();
       }},
      {"input", {C::kReduce, C::kImportState}, StoreString(&CtlArgs::input)},
      {"output", {C::kReduce, C::kExportState}, StoreString(&CtlArgs::output)},
      {"tensor", {C::kReduce}, StoreString(&CtlArgs::tensor)},
      {"step", {C::kReduce}, StoreInt("step", &CtlArgs::step, 0)},
      {"shape",
       {C::kReduce},
       [](absl::string_view v, CtlArgs& a) {
         GC_ASSIGN_OR_RETURN(a.shape, ParseShape(v));
         return absl::OkStatus();
       }},
      {"dtype",
       {C::kReduce},
       [](absl::string_view v, CtlArgs& a) {
         GC_ASSIGN_OR_RETURN(a.raw_dtype, ParseDType(v));
         return absl::OkStatus();
       }},
      {"numel",
       {C::kBench},
       [](absl::string_view v, CtlArgs& a) {
         // Its fp32 tensor goes inline: one gRPC message, under 2 GiB.
         constexpr int64_t kMax =
             (int64_t{std::numeric_limits<int32_t>::max()} - 4096) / 4;
         GC_ASSIGN_OR_RETURN(a.numel, ParseInt("numel", v, 1));
         if (a.numel > kMax) {
           return FlagError("numel", v,
                            absl::StrCat("an integer from 1 to ", kMax,
                                         " (an fp32 tensor sent inline, "
                                         "under gRPC's 2 GiB message)"));
         }
         return absl::OkStatus();
       }},
      {"iters", {C::kBench}, StoreInt("iters", &CtlArgs::iters, 1)},
      {"seed",
       {C::kBench},
       [](absl::string_view v, CtlArgs& a) {
         if (!absl::SimpleAtoi(v, &a.seed)) {
           return FlagError("seed", v, "a non-negative integer");
         }
         return absl::OkStatus();
       }},
  };
  return *flags;
}

const FlagSpec* FindFlag(absl::string_view name) {
  for (const FlagSpec& flag : Flags()) {
    if (flag.name == name) return &flag;
  }
  return nullptr;
}

bool TakesFlag(const FlagSpec& flag, CtlCommand command) {
  if (flag.commands.empty()) return true;
  for (CtlCommand c : flag.commands) {
    if (c == command) return true;
  }
  return false;
}

// Checks what one flag cannot: required flags and combinations.
absl::Status Validate(const CtlArgs& args) {
  if (args.codec && args.codec->name().empty()) {
    return absl::InvalidArgumentError(
        "--param needs --codec to name the codec");
  }
  if (args.from_step && args.policy_file.empty()) {
    return absl::InvalidArgumentError(
        "--from_step needs --set=FILE: it says when the new policy starts");
  }
  switch (args.command) {
    case CtlCommand::kReduce: {
      if (args.input.empty()) {
        return absl::InvalidArgumentError("reduce needs --input=FILE");
      }
      if (args.tensor.empty()) {
        return absl::InvalidArgumentError("reduce needs --tensor=NAME");
      }
      const bool npy = absl::EndsWith(args.input, ".npy");
      if (npy && args.shape) {
        return absl::InvalidArgumentError(
            "--shape is for raw input; an .npy file carries its own shape");
      }
      if (npy && args.raw_dtype) {
        return absl::InvalidArgumentError(
            "--dtype is for raw input; an .npy file carries its own dtype");
      }
      if (!npy && !args.shape) {
        return absl::InvalidArgumentError(absl::StrCat(
            "raw input '", args.input,
            "' needs --shape (and --dtype unless float32); or pass an .npy"));
      }
      if (!args.output.empty() && !absl::EndsWith(args.output, ".npy")) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--output=", args.output, ": expected a file name ending in .npy"));
      }
      return absl::OkStatus();
    }
    case CtlCommand::kBench:
      if (args.numel == 0) {
        return absl::InvalidArgumentError("bench needs --numel=N");
      }
      return absl::OkStatus();
    case CtlCommand::kExportState:
      if (args.output.empty()) {
        return absl::InvalidArgumentError("export-state needs --output=FILE");
      }
      return absl::OkStatus();
    case CtlCommand::kImportState:
      if (args.input.empty()) {
        return absl::InvalidArgumentError("import-state needs --input=FILE");
      }
      return absl::OkStatus();
    default:
      return absl::OkStatus();
  }
}

}  // namespace

std::string DefaultCtlTarget(const char* environment) {
  // Set but empty counts as unset, as in the Python client.
  return environment != nullptr && *environment != '\0' ? environment
                                                        : kDefaultTarget;
}

absl::StatusOr<CtlArgs> ParseCtlArgs(const std::vector<std::string>& args,
                                     const std::string& default_target) {
  CtlArgs parsed;
  parsed.target = default_target;
  bool have_command = false;
  // Flags are applied after the command is known, since it decides which
  // flags are allowed.
  std::vector<std::pair<std::string, std::string>> flags;
  for (size_t i = 0; i < args.size(); ++i) {
    absl::string_view arg = args[i];
    if (arg == "--help" || arg == "-h") {
      parsed.command = CtlCommand::kHelp;
      return parsed;
    }
    if (absl::ConsumePrefix(&arg, "--")) {
      std::pair<std::string, std::string> flag =
          absl::StrSplit(arg, absl::MaxSplits('=', 1));
      if (!absl::StrContains(arg, '=')) {
        if (i + 1 == args.size()) {
          return absl::InvalidArgumentError(
              absl::StrCat("--", arg, " needs a value"));
        }
        flag.second = args[++i];
      }
      flags.push_back(std::move(flag));
      continue;
    }
    if (have_command) {
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected argument '", arg, "' after command '",
                       NameOf(parsed.command), "'"));
    }
    bool known = false;
    for (const CommandName& c : kCommands) {
      if (c.name == arg) {
        parsed.command = c.command;
        known = true;
      }
    }
    if (!known) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown command '", arg, "'; expected ", ExpectedCommands()));
    }
    have_command = true;
  }
  if (!have_command) {
    return absl::InvalidArgumentError(absl::StrCat(
        "missing command; expected ", ExpectedCommands(), " (see --help)"));
  }
  for (const auto& [name, value] : flags) {
    const FlagSpec* flag = FindFlag(name);
    if (flag == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    }
    if (!TakesFlag(*flag, parsed.command)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "command '", NameOf(parsed.command), "' does not take --", name));
    }
    GC_RETURN_IF_ERROR(flag->set(value, parsed));
  }
  GC_RETURN_IF_ERROR(Validate(parsed));
  return parsed;
}

std::string CtlUsage() {
  return R"(gradcompctl: talk to a gradcompd daemon.

usage: gradcompctl [--target=HOST:PORT|unix:/PATH] [--timeout=300s] COMMAND [flags]

The target defaults to $GRADCOMP_TARGET, else unix:/run/gradcomp/gradcomp.sock.
A daemon on TCP with a client token wants $GRADCOMP_TOKEN.

commands:
  info      version, world size, codecs and their properties, policy hash
  policy    print the daemon's policy (text format)
              --set=FILE      replace it with a gradcomp.v1.Policy from FILE
                              (.json: protobuf JSON; otherwise text format)
              --from_step=N   the new policy decides steps >= N only (send
                              the same to every rank: all switch at step N)
  reduce    reduce one tensor and print its stats
              --input=FILE    .npy (float16/32/64, C order), or raw
                              little-endian bytes with --shape and --dtype
              --shape=D0,D1   shape of raw input (empty: a scalar)
              --dtype=T       float32 (default), float16 or float64
              --tensor=NAME   tensor name (required)
              --step=N        training step (default 0)
              --job=NAME      job (default "default")
              --codec=NAME    override the policy's codec
              --param=K=V     codec parameter, repeatable (e.g. ratio=0.01)
              --output=FILE   write the result as .npy
  bench     reduce a synthetic gradient repeatedly (one tensor, steps 0..K-1)
            and print bytes, ratio, relative error and latency percentiles;
            with error feedback (topk) each step also sends the residuals of
            the earlier ones, so its error against the input may exceed 1
              --numel=N       elements (required)
              --iters=K       reduces (default 20)
              --codec=NAME, --param=K=V, --job=NAME, --seed=S
  export-state  write a job's codec state (residuals, momenta, warm starts)
            to a file, for a checkpoint
              --job=NAME      job (default "default")
              --output=FILE   where the state goes (required)
  import-state  restore a job's codec state from export-state's file
              --job=NAME      job (default "default")
              --input=FILE    the file (required)
  release   end a job on this daemon once its last step is done here: free
            its codec state, tensor list and gossip state, and print what
            was freed (run it against every worker's daemon)
              --job=NAME      job (default "default")
)";
}

}  // namespace gradcomp::client
