// Four real gradcompd processes on loopback, each with its own trainer
// process (peer_worker) submitting 50 tensors x 20 steps in a random order
// of its own: every codec's averages are bit-identical on all ranks, dense
// ones equal the true mean, compressed ones equal a single-process replay of
// the codec. Then a daemon is killed mid-step and comes back.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "codecs/builtin.h"
#include "codecs/params.h"
#include "codecs/state.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/daemon_process.h"
#include "tests/integration/peer_workload.h"

namespace gradcomp::testing {
namespace {

using ::testing::HasSubstr;

constexpr int kWorld = 4;
constexpr uint64_t kSeed = 7;

std::string WorkerBinary() {
  return absl::StrCat(std::getenv("TEST_SRCDIR"),
                      "/gradcomp/tests/integration/peer_worker");
}

std::string TmpPath(const std::string& name) {
  return absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

// The value of an unlabelled sample, or of `name{labels}` spelled exactly.
double Sample(const std::string& page, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(page, '\n')) {
    if (absl::ConsumePrefix(&line, series + " ")) {
      double value = 0;
      if (absl::SimpleAtod(line, &value)) return value;
    }
  }
  return -1;
}

// The daemons of one job, rank r at peers[r].
class Cluster {
 public:
  explicit Cluster(absl::Duration collective_timeout)
      : timeout_(collective_timeout) {
    std::vector<std::string> peers;
    for (int r = 0; r < kWorld; ++r) {
      peers.push_back(absl::StrCat("127.0.0.1:", *FreePort()));
    }
    peers_ = absl::StrJoin(peers, ",");
    daemons_.resize(kWorld);
  }

  absl::Status Start(int rank) {
    auto binary = DaemonBinary();
    if (!binary.ok()) return binary.status();
    auto daemon = DaemonProcess::Start(
        *binary,
        {absl::StrCat("--world_size=", kWorld), absl::StrCat("--rank=", rank),
         absl::StrCat("--peers=", peers_), absl::StrCat("--seed=", kSeed),
         absl::StrCat("--collective_timeout=",
                      absl::FormatDuration(timeout_))});
    if (!daemon.ok()) return daemon.status();
    daemons_[rank] = std::move(*daemon);
    return absl::OkStatus();
  }

  // Until every daemon reports all its peers connected both ways.
  absl::Status WaitMeshUp() {
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    for (int r = 0; r < kWorld; ++r) {
      while (true) {
        auto page = HttpGet(daemons_[r]->metrics_port(), "/metrics");
        if (page.ok() && Sample(*page, "gradcomp_peers_up") == kWorld - 1)
          break;
        if (absl::Now() > deadline) {
          return absl::DeadlineExceededError(
              absl::StrCat("rank ", r, " never saw all its peers; log:\n",
                           daemons_[r]->Log()));
        }
        absl::SleepFor(absl::Milliseconds(50));
      }
    }
    return absl::OkStatus();
  }

  DaemonProcess& daemon(int rank) { return *daemons_[rank]; }

 private:
  absl::Duration timeout_;
  std::string peers_;
  std::vector<std::unique_ptr<DaemonProcess>> daemons_;
};

struct WorkerRun {
  int rank;
  std::string job, codec, params;
  int64_t first;
  int steps, tensors;
  std::string out;
};

// Starts one peer_worker process per run and waits for all of them; returns
// their exit codes.
std::vector<int> RunWorkers(Cluster& cluster,
                            const std::vector<WorkerRun>& runs) {
  std::vector<pid_t> pids;
  for (const WorkerRun& run : runs) {
    std::vector<std::string> args = {WorkerBinary(),
                                     cluster.daemon(run.rank).target(),
                                     std::to_string(run.rank),
                                     run.job,
                                     run.codec,
                                     run.params,
                                     std::to_string(run.first),
                                     std::to_string(run.steps),
                                     std::to_string(run.tensors),
                                     run.out};
    std::vector<char*> argv;
    for (std::string& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    const pid_t pid = fork();
    if (pid == 0) {
      execv(argv[0], argv.data());
      _exit(127);
    }
    pids.push_back(pid);
  }
  std::vector<int> codes;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  }
  return codes;
}

std::vector<float> AsFloats(const std::string& bytes) {
  std::vector<float> values(bytes.size() / sizeof(float));
  std::memcpy(values.data(), bytes.data(), values.size() * sizeof(float));
  return values;
}

constexpr int kTensors = 50;
constexpr int kSteps = 20;

struct CodecCase {
  const char* name;
  const char* params;  // "k=v,..." or "-"
};

class PeersTest : public ::testing::TestWithParam<CodecCase> {
 protected:
  static void SetUpTestSuite() {
    cluster_ = new Cluster(absl::Seconds(60));
    for (int r = 0; r < kWorld; ++r) ASSERT_TRUE(cluster_->Start(r).ok());
    const absl::Status up = cluster_->WaitMeshUp();
    ASSERT_TRUE(up.ok()) << up;
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  static Cluster* cluster_;
};
Cluster* PeersTest::cluster_ = nullptr;

TEST_P(PeersTest, FourDaemonsAgreeBitForBitAndMatchTheirCodec) {
  const CodecCase c = GetParam();
  const std::string job = absl::StrCat("job-", c.name);
  std::vector<WorkerRun> runs;
  for (int r = 0; r < kWorld; ++r) {
    runs.push_back({r, job, c.name, c.params, 0, kSteps, kTensors,
                    TmpPath(absl::StrCat(c.name, "-rank", r, ".bin"))});
  }
  const absl::Time start = absl::Now();
  const std::vector<int> codes = RunWorkers(*cluster_, runs);
  const absl::Duration took = absl::Now() - start;
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_EQ(codes[r], 0) << "rank " << r << ": "
                           << ReadFile(runs[r].out + ".err")
                           << "\ndaemon log:\n"
                           << cluster_->daemon(r).Log();
  }
  // Measured, not asserted: the figure docs/peers.md quotes.
  std::printf("codec %s: %d steps x %d tensors on %d daemons in %s (%s/step)\n",
              c.name, kSteps, kTensors, kWorld,
              absl::FormatDuration(took).c_str(),
              absl::FormatDuration(took / kSteps).c_str());

  const std::string rank0 = ReadFile(runs[0].out);
  for (int r = 1; r < kWorld; ++r) {
    EXPECT_TRUE(ReadFile(runs[r].out) == rank0)
        << "rank " << r << "'s averages differ from rank 0's";
  }
  const std::vector<float> got = AsFloats(rank0);

  const std::string codec_name = c.name;
  const bool dense = codec_name == "none" || codec_name == "fp16";
  codecs::CodecParams params;
  std::map<std::string, std::string> kv;
  if (std::string(c.params) != "-") {
    for (absl::string_view item : absl::StrSplit(c.params, ',')) {
      std::pair<std::string, std::string> p = absl::StrSplit(item, '=');
      kv.insert(p);
    }
  }
  auto codec = codecs::BuiltinCodecs().Create(c.name, codecs::CodecParams(kv));
  ASSERT_TRUE(codec.ok()) << codec.status();
  std::vector<codecs::StateStore> stores(kWorld);
  // Relative tolerance of one element against the true mean: fp32 sums of
  // W values, or fp16's rounding of inputs and of the summed slices.
  const double rel =
      codec_name == "fp16" ? std::ldexp(1.0, -10) : std::ldexp(1.0, -22);
  size_t offset = 0;
  for (int64_t step = 0; step < kSteps; ++step) {
    for (int t = 0; t < kTensors; ++t) {
      std::vector<std::vector<float>> grads;
      for (int r = 0; r < kWorld; ++r)
        grads.push_back(WorkloadGradient(r, t, step));
      const size_t n = grads[0].size();
      ASSERT_LE(offset + n, got.size());
      if (dense) {
        for (size_t i = 0; i < n; ++i) {
          double mean = 0, magnitude = 0;
          for (int r = 0; r < kWorld; ++r) {
            mean += grads[r][i];
            magnitude += std::fabs(grads[r][i]);
          }
          mean /= kWorld;
          magnitude /= kWorld;
          ASSERT_NEAR(got[offset + i], mean,
                      rel * (magnitude + std::fabs(mean)) + 1e-7)
              << c.name << " step " << step << " tensor " << t << " [" << i
              << "]";
        }
      } else {
        auto replay = Replay(**codec, grads, WorkloadShape(t), job,
                             WorkloadTensorName(t), step, kSeed, stores);
        ASSERT_TRUE(replay.ok()) << replay.status();
        ASSERT_EQ(std::memcmp(got.data() + offset, (*replay)[0].data(),
                              n * sizeof(float)),
                  0)
            << c.name << " step " << step << " tensor " << t
            << ": differs from the single-process replay";
        if (codec_name == "qsgd") {
          // QSGD's documented variance, E||Q(v) - v||^2 <=
          // min(d/s^2, sqrt(d)/s) ||v||^2, averaged over W independent ranks.
          const double d = 512, s = 7;
          double bound = 0, err = 0;
          for (int r = 0; r < kWorld; ++r) {
            double norm = 0;
            for (float v : grads[r]) norm += double{v} * v;
            bound += std::min(d / (s * s), std::sqrt(d) / s) * norm;
          }
          bound /= double{kWorld} * kWorld;
          for (size_t i = 0; i < n; ++i) {
            double mean = 0;
            for (int r = 0; r < kWorld; ++r) mean += grads[r][i];
            mean /= kWorld;
            err += (got[offset + i] - mean) * (got[offset + i] - mean);
          }
          EXPECT_LE(err, bound) << "step " << step << " tensor " << t;
        }
      }
      offset += n;
    }
  }
  EXPECT_EQ(offset, got.size());
}

INSTANTIATE_TEST_SUITE_P(
    Codecs, PeersTest,
    ::testing::Values(CodecCase{"none", "-"}, CodecCase{"fp16", "-"},
                      CodecCase{"qsgd", "bits=4,bucket=512"},
                      CodecCase{"topk", "ratio=0.05,momentum=0"}),
    [](const ::testing::TestParamInfo<CodecCase>& info) {
      return std::string(info.param.name);
    });

TEST(PeersFaultTest, AKilledDaemonIsNamedAndTheNextStepWorksAfterRestart) {
  Cluster cluster(absl::Seconds(5));
  for (int r = 0; r < kWorld; ++r) ASSERT_TRUE(cluster.Start(r).ok());
  ASSERT_TRUE(cluster.WaitMeshUp().ok());
  constexpr int kFew = 5;
  auto runs_for = [&](int64_t step, int ranks) {
    std::vector<WorkerRun> runs;
    for (int r = 0; r < ranks; ++r) {
      runs.push_back(
          {r, "fault", "none", "-", step, 1, kFew,
           TmpPath(absl::StrCat("fault-", step, "-rank", r, ".bin"))});
    }
    return runs;
  };
  for (int code : RunWorkers(cluster, runs_for(0, kWorld))) EXPECT_EQ(code, 0);

  // Step 1: ranks 0-2 reduce and wait on rank 3, whose daemon dies once
  // each of them has sent it its step-1 slices.
  auto sent_to_3 = [&](int r) {
    auto page = HttpGet(cluster.daemon(r).metrics_port(), "/metrics");
    return page.ok() ? Sample(*page,
                              "gradcomp_peer_bytes_total{direction="
                              "\"sent\",peer=\"3\"}")
                     : -1;
  };
  std::vector<double> before;
  for (int r = 0; r < kWorld - 1; ++r) before.push_back(sent_to_3(r));
  std::thread killer([&] {
    for (int r = 0; r < kWorld - 1; ++r) {
      while (sent_to_3(r) <= before[r]) absl::SleepFor(absl::Milliseconds(20));
    }
    cluster.daemon(3).Kill();
  });
  const std::vector<WorkerRun> survivors = runs_for(1, kWorld - 1);
  const std::vector<int> codes = RunWorkers(cluster, survivors);
  killer.join();
  for (int r = 0; r < kWorld - 1; ++r) {
    EXPECT_EQ(codes[r], 3) << "rank " << r;
    const std::string error = ReadFile(survivors[r].out + ".err");
    EXPECT_THAT(error, HasSubstr("rank 3"));
    EXPECT_TRUE(absl::StrContains(error, "UNAVAILABLE") ||
                absl::StrContains(error, "DEADLINE_EXCEEDED"))
        << error;
  }

  // Rank 3 comes back on the same peer address; step 2 works everywhere.
  ASSERT_TRUE(cluster.Start(3).ok());
  ASSERT_TRUE(cluster.WaitMeshUp().ok());
  const std::vector<WorkerRun> after = runs_for(2, kWorld);
  const std::vector<int> after_codes = RunWorkers(cluster, after);
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_EQ(after_codes[r], 0) << ReadFile(after[r].out + ".err");
  }
  const std::vector<float> got = AsFloats(ReadFile(after[0].out));
  size_t offset = 0;
  for (int t = 0; t < kFew; ++t) {
    std::vector<std::vector<float>> grads;
    for (int r = 0; r < kWorld; ++r) grads.push_back(WorkloadGradient(r, t, 2));
    for (size_t i = 0; i < grads[0].size(); ++i) {
      double mean = 0;
      for (int r = 0; r < kWorld; ++r) mean += grads[r][i];
      ASSERT_NEAR(got[offset + i], mean / kWorld, 1e-8);
    }
    offset += grads[0].size();
  }
  EXPECT_EQ(offset, got.size());
}

}  // namespace
}  // namespace gradcomp::testing
