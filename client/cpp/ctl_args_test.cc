#include "client/cpp/ctl_args.h"

#include <string>
#include <vector>

#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradcomp::client {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kTestTarget[] = "127.0.0.1:50051";

absl::StatusOr<CtlArgs> Parse(const std::vector<std::string>& args) {
  return ParseCtlArgs(args, kTestTarget);
}

std::string ErrorOf(const std::vector<std::string>& args) {
  absl::StatusOr<CtlArgs> parsed = Parse(args);
  EXPECT_FALSE(parsed.ok());
  return std::string(parsed.status().message());
}

TEST(CtlArgsTest, InfoUsesDefaultTarget) {
  absl::StatusOr<CtlArgs> args = Parse({"info"});
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_EQ(args->command, CtlCommand::kInfo);
  EXPECT_EQ(args->target, kTestTarget);
  EXPECT_EQ(args->timeout, absl::Seconds(300));
}

TEST(CtlArgsTest, GlobalFlagsBeforeOrAfterCommand) {
  absl::StatusOr<CtlArgs> args =
      Parse({"--target", "unix:/tmp/g.sock", "info", "--timeout=5s"});
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_EQ(args->target, "unix:/tmp/g.sock");
  EXPECT_EQ(args->timeout, absl::Seconds(5));
}

TEST(CtlArgsTest, ReduceNpyWithCodecAndParams) {
  absl::StatusOr<CtlArgs> args =
      Parse({"reduce", "--input=g.npy", "--tensor", "fc.weight", "--step=7",
             "--codec=topk", "--param=ratio=0.01", "--param", "momentum=0.9",
             "--output=out.npy", "--job=j1"});
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_EQ(args->command, CtlCommand::kReduce);
  EXPECT_EQ(args->input, "g.npy");
  EXPECT_EQ(args->tensor, "fc.weight");
  EXPECT_EQ(args->step, 7);
  EXPECT_EQ(args->job, "j1");
  EXPECT_EQ(args->output, "out.npy");
  ASSERT_TRUE(args->codec.has_value());
  EXPECT_EQ(args->codec->name(), "topk");
  EXPECT_EQ(args->codec->params().at("ratio"), "0.01");
  EXPECT_EQ(args->codec->params().at("momentum"), "0.9");
  EXPECT_FALSE(args->shape.has_value());
}

TEST(CtlArgsTest, ParamValueMayContainEquals) {
  absl::StatusOr<CtlArgs> args = Parse(
      {"reduce", "--input=g.npy", "--tensor=t", "--codec=x", "--param=k=a=b"});
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_EQ(args->codec->params().at("k"), "a=b");
}

TEST(CtlArgsTest, ReduceRawNeedsShape) {
  EXPECT_THAT(ErrorOf({"reduce", "--input=g.raw", "--tensor=t"}),
              HasSubstr("needs --shape"));
  absl::StatusOr<CtlArgs> args = Parse({"reduce", "--input=g.raw", "--tensor=t",
                                        "--shape=2,3,4", "--dtype=float16"});
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_THAT(*args->shape, ElementsAre(2, 3, 4));
  EXPECT_EQ(args->raw_dtype, NpyDType::kFloat16);

  args = Parse({"reduce", "--input=g.raw", "--tensor=t", "--shape="});
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_TRUE(args->shape->empty()) << "an empty shape is a scalar";
}

TEST(CtlArgsTest, ReduceRejectsShapeForNpyAndBadShapes) {
  EXPECT_THAT(ErrorOf({"reduce", "--input=g.npy", "--tensor=t", "--shape=3"}),
              HasSubstr("carries its own shape"));
  // It was ignored: the file's dtype won, whatever the command line said.
  EXPECT_THAT(
      ErrorOf({"reduce", "--input=g.npy", "--tensor=t", "--dtype=float16"}),
      HasSubstr("carries its own dtype"));
  EXPECT_THAT(ErrorOf({"reduce", "--input=g.raw", "--tensor=t", "--shape=3,x"}),
              HasSubstr("--shape=3,x: expected comma-separated"));
  EXPECT_THAT(ErrorOf({"reduce", "--input=g.raw", "--tensor=t", "--shape=-1"}),
              HasSubstr("non-negative"));
}

TEST(CtlArgsTest, ReduceRequiresInputAndTensor) {
  EXPECT_THAT(ErrorOf({"reduce", "--tensor=t"}), HasSubstr("--input"));
  EXPECT_THAT(ErrorOf({"reduce", "--input=g.npy"}), HasSubstr("--tensor"));
}

TEST(CtlArgsTest, RejectsBadValues) {
  EXPECT_THAT(ErrorOf({"reduce", "--input=g.npy", "--tensor=t", "--step=-2"}),
              HasSubstr("--step=-2: expected an integer >= 0"));
  EXPECT_THAT(ErrorOf({"bench", "--numel=0"}), HasSubstr("--numel=0"));
  // Allocated and sent inline: a size that cannot go was an abort
  // (std::length_error) instead of a command-line error.
  EXPECT_THAT(ErrorOf({"bench", "--numel=4611686018427387904"}),
              HasSubstr("an integer from 1 to 536869887"));
  EXPECT_THAT(ErrorOf({"info", "--timeout=soon"}), HasSubstr("--timeout=soon"));
  EXPECT_THAT(ErrorOf({"reduce", "--input=g.raw", "--tensor=t", "--shape=1",
                       "--dtype=int8"}),
              HasSubstr("float32, float16 or float64"));
  EXPECT_THAT(
      ErrorOf({"reduce", "--input=g.npy", "--tensor=t", "--output=o.txt"}),
      HasSubstr("ending in .npy"));
}

TEST(CtlArgsTest, ParamNeedsCodecAndNameValue) {
  EXPECT_THAT(ErrorOf({"bench", "--numel=10", "--param=ratio=0.1"}),
              HasSubstr("--param needs --codec"));
  EXPECT_THAT(ErrorOf({"bench", "--numel=10", "--codec=topk", "--param=ratio"}),
              HasSubstr("name=value"));
  EXPECT_THAT(ErrorOf({"bench", "--numel=10", "--codec=topk", "--param=a=1",
                       "--param=a=2"}),
              HasSubstr("'a' is repeated"));
}

TEST(CtlArgsTest, Bench) {
  absl::StatusOr<CtlArgs> args =
      Parse({"bench", "--numel=1000000", "--codec=qsgd", "--iters=5",
             "--seed=9", "--param=bits=4"});
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_EQ(args->command, CtlCommand::kBench);
  EXPECT_EQ(args->numel, 1000000);
  EXPECT_EQ(args->iters, 5);
  EXPECT_EQ(args->seed, 9u);
  EXPECT_EQ(args->codec->params().at("bits"), "4");
  EXPECT_EQ(Parse({"bench", "--numel=3"})->iters, 20);
}

TEST(CtlArgsTest, PolicySet) {
  absl::StatusOr<CtlArgs> args = Parse({"policy", "--set", "p.textproto"});
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_EQ(args->command, CtlCommand::kPolicy);
  EXPECT_EQ(args->policy_file, "p.textproto");
  EXPECT_FALSE(args->from_step.has_value());

  args = Parse({"policy", "--set=p.json", "--from_step=1000"});
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_EQ(args->from_step, 1000);
  EXPECT_THAT(Parse({"policy", "--from_step=1000"}).status().message(),
              HasSubstr("--from_step needs --set=FILE"));
  EXPECT_THAT(
      Parse({"policy", "--set=p.json", "--from_step=-1"}).status().message(),
      HasSubstr("an integer >= 0"));
}

TEST(CtlArgsTest, AnEmptyPolicyFileIsAnError) {
  // --set=$UNSET printed the current policy and exited 0.
  EXPECT_THAT(Parse({"policy", "--set="}).status().message(),
              HasSubstr("--set"));
}

TEST(CtlArgsTest, AnEmptyTargetVariableIsUnset) {
  EXPECT_EQ(DefaultCtlTarget(nullptr), kDefaultTarget);
  EXPECT_EQ(DefaultCtlTarget(""), kDefaultTarget);
  EXPECT_EQ(DefaultCtlTarget("127.0.0.1:5"), "127.0.0.1:5");
}

TEST(CtlArgsTest, StateExportAndImportNeedTheirFile) {
  absl::StatusOr<CtlArgs> out =
      Parse({"export-state", "--job=run", "--output=s.bin"});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->command, CtlCommand::kExportState);
  EXPECT_EQ(out->output, "s.bin");
  absl::StatusOr<CtlArgs> in = Parse({"import-state", "--input", "s.bin"});
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_EQ(in->command, CtlCommand::kImportState);
  EXPECT_EQ(in->input, "s.bin");
  EXPECT_THAT(ErrorOf({"export-state"}), HasSubstr("needs --output=FILE"));
  EXPECT_THAT(ErrorOf({"import-state"}), HasSubstr("needs --input=FILE"));
  EXPECT_THAT(ErrorOf({"export-state", "--input=s.bin", "--output=t"}),
              HasSubstr("command 'export-state' does not take --input"));
}

TEST(CtlArgsTest, ReleaseTakesAJob) {
  absl::StatusOr<CtlArgs> args = Parse({"release", "--job=run-42"});
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_EQ(args->command, CtlCommand::kRelease);
  EXPECT_EQ(args->job, "run-42");
  EXPECT_THAT(ErrorOf({"release", "--codec=topk"}),
              HasSubstr("command 'release' does not take --codec"));
}

TEST(CtlArgsTest, RejectsUnknownAndMisplacedFlagsAndCommands) {
  EXPECT_THAT(ErrorOf({}), HasSubstr("missing command"));
  EXPECT_THAT(
      ErrorOf({"frobnicate"}),
      HasSubstr("unknown command 'frobnicate'; expected info, policy, "
                "reduce, bench, export-state, import-state or release"));
  EXPECT_THAT(ErrorOf({}), HasSubstr("import-state or release (see --help)"));
  EXPECT_THAT(ErrorOf({"info", "extra"}),
              HasSubstr("unexpected argument 'extra'"));
  EXPECT_THAT(ErrorOf({"info", "--colour=red"}),
              HasSubstr("unknown flag --colour"));
  EXPECT_THAT(ErrorOf({"info", "--codec=topk"}),
              HasSubstr("command 'info' does not take --codec"));
  EXPECT_THAT(ErrorOf({"info", "--target"}),
              HasSubstr("--target needs a value"));
}

TEST(CtlArgsTest, HelpWins) {
  absl::StatusOr<CtlArgs> args = Parse({"reduce", "--help"});
  ASSERT_TRUE(args.ok());
  EXPECT_EQ(args->command, CtlCommand::kHelp);
  EXPECT_THAT(CtlUsage(), HasSubstr("bench"));
}

}  // namespace
}  // namespace gradcomp::client
