// Limits and job isolation on four real gradcompd processes (docs/daemon.md,
// "Limits"): two jobs reducing the same tensor names at the same steps get
// each its own mean; a flood of unary reduces beyond the memory budget and
// of stream tensors beyond the bounded queue is answered RESOURCE_EXHAUSTED
// (counted), resident memory stays bounded, nothing stays reserved, and the
// daemon then serves a normal job.
#include <sys/types.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster.h"
#include "tests/integration/daemon_process.h"

namespace gradcomp::testing {
namespace {

using ::testing::HasSubstr;

constexpr int kWorld = 4;
constexpr uint64_t kBudget = 8 << 20;
constexpr int kQueue = 4;
// With peers the daemon runs stream tensors on up to 256 workers, started
// as needed (main.cc, service/api/worker_pool.h).
constexpr int kStreamWorkers = 256;

// VmRSS of `pid` in bytes.
uint64_t ResidentBytes(pid_t pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    absl::string_view rest = line;
    if (absl::ConsumePrefix(&rest, "VmRSS:")) {
      uint64_t kib = 0;
      if (absl::SimpleAtoi(
              absl::StripSuffix(absl::StripAsciiWhitespace(rest), " kB"),
              &kib)) {
        return kib << 10;
      }
    }
  }
  return 0;
}

// The four daemons of the suite.
Cluster* cluster = nullptr;

DaemonProcess& Daemon(int rank) { return cluster->daemon(rank); }

double Metric(int rank, const std::string& series) {
  auto page = HttpGet(Daemon(rank).metrics_port(), "/metrics");
  EXPECT_TRUE(page.ok()) << page.status();
  return page.ok() ? Sample(*page, series) : -1;
}

class LimitsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // No error samples: a sampled reduce reserves two tensors more, and the
    // flood's figures below count the others' 4 MiB. The collective
    // deadline leaves the ranks of a correct step time to meet on a loaded
    // machine; the flood's admitted reduces wait it out.
    cluster = new Cluster(
        kWorld, absl::Seconds(10),
        {absl::StrCat("--memory_budget_bytes=", kBudget), "--memory_wait=200ms",
         absl::StrCat("--max_queued_requests=", kQueue),
         "--error_sample_rate=0"});
    const absl::Status started = cluster->StartAll();
    ASSERT_TRUE(started.ok()) << started;
  }
  static void TearDownTestSuite() {
    delete cluster;
    cluster = nullptr;
  }
};

// Integers (exact in fp32, and so are their sums and quarters), different
// for every job, rank, step and element.
std::vector<float> Values(size_t job, int rank, int step, int n) {
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) {
    v[i] = static_cast<float>((job == 0 ? 1 : -7) * (rank * 1000 + i % 97) +
                              step * 3 + static_cast<int>(job) * 5);
  }
  return v;
}

std::vector<float> Mean(size_t job, int step, int n) {
  std::vector<float> mean(n, 0);
  for (int r = 0; r < kWorld; ++r) {
    const std::vector<float> v = Values(job, r, step, n);
    for (int i = 0; i < n; ++i) mean[i] += v[i];
  }
  for (float& x : mean) x /= kWorld;
  return mean;
}

// Every rank reduces every job in `jobs` at once (a thread per rank and
// job), all with the same tensor name and step, through the dense codec;
// every result must be its own job's mean.
void ExpectEachJobsOwnMean(const std::vector<std::string>& jobs, int step,
                           int n) {
  std::vector<std::vector<std::vector<float>>> got(
      jobs.size(), std::vector<std::vector<float>>(kWorld));
  std::vector<std::thread> threads;
  for (size_t j = 0; j < jobs.size(); ++j) {
    for (int r = 0; r < kWorld; ++r) {
      threads.emplace_back([&jobs, &got, j, r, step, n] {
        auto client = Daemon(r).Connect();
        ASSERT_TRUE(client.ok()) << client.status();
        v1::CodecSpec none;
        none.set_name("none");
        const std::vector<int64_t> shape = {n};
        auto result = (*client)->Reduce(jobs[j], "layer.weight", step,
                                        Values(j, r, step, n), shape, none);
        ASSERT_TRUE(result.ok())
            << jobs[j] << " rank " << r << ": " << result.status();
        got[j][r] = std::move(result->values);
      });
    }
  }
  for (std::thread& t : threads) t.join();
  for (size_t j = 0; j < jobs.size(); ++j) {
    const std::vector<float> mean = Mean(j, step, n);
    for (int r = 0; r < kWorld; ++r) {
      EXPECT_TRUE(got[j][r] == mean)
          << "job " << jobs[j] << " rank " << r << " step " << step
          << " did not get its own job's mean";
    }
  }
}

TEST_F(LimitsTest, TwoJobsWithTheSameTensorNamesGetEachTheirOwnMean) {
  for (int step = 0; step < 5; ++step) {
    ExpectEachJobsOwnMean({"alpha", "beta"}, step, 4096);
  }
}

TEST_F(LimitsTest, FloodIsRefusedWithResourceExhaustedAndTheDaemonServesOn) {
  const uint64_t rss_before = ResidentBytes(Daemon(0).pid());
  ASSERT_GT(rss_before, 0u);

  // Unary flood on rank 0 alone: the other ranks never come, so each
  // admitted reduce holds its 4 MiB (1 MiB input, payload, average,
  // response) until the 10 s collective deadline; two fit in the 8 MiB
  // budget, the others wait 200 ms for room and are refused.
  constexpr int kClients = 8;
  constexpr int kFloats = 256 << 10;
  std::vector<absl::Status> unary(kClients);
  {
    std::vector<std::thread> threads;
    for (int c = 0; c < kClients; ++c) {
      threads.emplace_back([&unary, c] {
        auto client = Daemon(0).Connect();
        ASSERT_TRUE(client.ok());
        const std::vector<float> values(kFloats, 1.0f);
        const std::vector<int64_t> shape = {kFloats};
        unary[c] =
            (*client)
                ->Reduce("flood", absl::StrCat("big", c), 0, values, shape)
                .status();
      });
    }
    for (std::thread& t : threads) t.join();
  }
  int unary_refused = 0;
  for (const absl::Status& status : unary) {
    if (absl::IsResourceExhausted(status)) {
      ++unary_refused;
      EXPECT_THAT(status.message(), HasSubstr("memory budget:"));
      EXPECT_THAT(status.message(), HasSubstr("of the budget's 8388608 bytes"));
    } else {
      // Admitted: it waited for the absent ranks until the deadline.
      EXPECT_TRUE(absl::IsDeadlineExceeded(status)) << status;
    }
  }
  EXPECT_GE(unary_refused, 1);
  EXPECT_LE(unary_refused, kClients - 2);

  // Stream flood: every worker busy with a tensor whose ranks never come,
  // kQueue more queued, the rest refused at once; the stream goes on.
  constexpr int kRefusedAtLeast = 20;
  const int sent = kStreamWorkers + kQueue + kRefusedAtLeast;
  auto channel = grpc::CreateChannel(Daemon(0).target(),
                                     grpc::InsecureChannelCredentials());
  auto stub = v1::Gradcomp::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(60));
  auto stream = stub->ReduceStream(&context);
  for (int i = 0; i < sent; ++i) {
    v1::ReduceRequest request;
    request.set_job("flood");
    request.set_tensor(absl::StrCat("s", i));
    request.set_dtype(v1::DTYPE_FLOAT32);
    request.add_shape(4);
    request.set_data(std::string(16, '\0'));
    request.set_request_id(i);
    ASSERT_TRUE(stream->Write(request));
  }
  stream->WritesDone();
  int answers = 0, queue_refused = 0;
  v1::ReduceStreamResponse response;
  while (stream->Read(&response)) {
    ++answers;
    if (response.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      ++queue_refused;
      EXPECT_THAT(response.error_message(),
                  HasSubstr("stream tensors are already waiting for a worker"));
    }
  }
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_EQ(answers, sent);
  EXPECT_GE(queue_refused, 1);

  EXPECT_EQ(
      Metric(0, R"(gradcomp_resource_exhausted_total{resource="memory"})"),
      unary_refused);
  EXPECT_EQ(
      Metric(0,
             R"(gradcomp_resource_exhausted_total{resource="stream_queue"})"),
      queue_refused);
  ASSERT_TRUE(Daemon(0).Running()) << Daemon(0).Log();

  // A normal job is served on every rank, and the flood left nothing
  // reserved (the dense codec keeps no state).
  ExpectEachJobsOwnMean({"after"}, 0, 4096);
  EXPECT_EQ(Metric(0, "gradcomp_memory_budget_in_use_bytes"), 0);

  // Measured and bounded: the flood carried 8 MiB of unary inputs at once;
  // the budget kept at most 8 MiB of reduces in flight.
  const uint64_t rss_after = ResidentBytes(Daemon(0).pid());
  std::printf(
      "rank 0 RSS: %.1f MiB before the flood, %.1f MiB after; "
      "refused: %d unary (memory), %d stream (queue)\n",
      rss_before / 1048576.0, rss_after / 1048576.0, unary_refused,
      queue_refused);
  EXPECT_LT(rss_after, rss_before + (uint64_t{64} << 20));
}

}  // namespace
}  // namespace gradcomp::testing
