// The engine's gossip mode: W engines over one in-process group, each
// reducing on its own thread as W daemons would.
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "codecs/builtin.h"
#include "codecs/state.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/collective/batching_collective.h"
#include "service/collective/in_process_group.h"
#include "service/engine/engine.h"
#include "service/metrics/metrics.h"
#include "service/metrics/metrics_testing.h"

namespace gradcomp::service {
namespace {

using ::testing::HasSubstr;

constexpr int kWorld = 4;

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal;
  std::vector<float> v(n);
  for (float& x : v) x = normal(gen);
  return v;
}

std::string Bytes(const std::vector<float>& v) {
  std::string out(v.size() * sizeof(float), '\0');
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

class EngineGossipTest : public ::testing::Test {
 protected:
  EngineGossipTest() { Restart(); }

  // Every rank's daemon starts again: fresh group, stores and engines.
  void Restart() {
    engines_.clear();
    metrics_.clear();
    stores_.clear();
    group_ = std::make_unique<InProcessGroup>(kWorld, absl::Seconds(30));
    for (int r = 0; r < kWorld; ++r) {
      stores_.push_back(std::make_unique<codecs::StateStore>());
      metrics_.push_back(
          std::make_unique<Metrics>(stores_.back().get(), "test"));
      engines_.push_back(MakeEngine(r));
    }
  }

  std::unique_ptr<Engine> MakeEngine(int r) {
    EngineOptions options = options_;
    options.seed = 5;
    auto engine =
        Engine::Create(options, codecs::BuiltinCodecs(), stores_[r].get(),
                       &group_->collective(r), metrics_[r].get(), Policy());
    EXPECT_TRUE(engine.ok()) << engine.status();
    return std::move(*engine);
  }

  ReduceInput Input(const std::string& data, std::vector<int64_t> shape,
                    int64_t step, const GossipSpec& spec) {
    ReduceInput in;
    in.job = "job";
    in.tensor = "w";
    in.step = step;
    in.shape = std::move(shape);
    in.data = data;
    in.mode = ReduceMode::kGossip;
    in.gossip = spec;
    in.consensus_distance = reported_distance_;
    return in;
  }

  // `rounds` gossip reduces of xs[r] on every rank, in place.
  void Rounds(std::vector<std::vector<float>>& xs, std::vector<int64_t> shape,
              const GossipSpec& spec, int64_t first, int rounds) {
    std::vector<std::thread> threads;
    for (int r = 0; r < kWorld; ++r) {
      threads.emplace_back([&, r] {
        for (int64_t s = first; s < first + rounds; ++s) {
          absl::StatusOr<std::string> data = EncodeFromFloat(dtypes_[r], xs[r]);
          ASSERT_TRUE(data.ok()) << data.status();
          ReduceInput in = Input(*data, shape, s, spec);
          in.dtype = dtypes_[r];
          absl::StatusOr<ReduceOutput> out = engines_[r]->Reduce(in);
          ASSERT_TRUE(out.ok()) << "rank " << r << ": " << out.status();
          ASSERT_TRUE(
              DecodeToFloat(dtypes_[r], out->data, absl::MakeSpan(xs[r])).ok());
          last_stats_[r] = out->stats;
        }
      });
    }
    for (std::thread& t : threads) t.join();
  }

  EngineOptions options_;  // every engine's, but for the seed
  std::unique_ptr<InProcessGroup> group_;
  std::vector<std::unique_ptr<codecs::StateStore>> stores_;
  std::vector<std::unique_ptr<Metrics>> metrics_;
  std::vector<std::unique_ptr<Engine>> engines_;
  ReduceStats last_stats_[kWorld];
  DType dtypes_[kWorld] = {DType::kFloat32, DType::kFloat32, DType::kFloat32,
                           DType::kFloat32};  // what each rank sends
  double reported_distance_ = 0;
};

// Exact gossip sends a copy of the tensor to each neighbour and gets one
// from each: the reduce reserves them in the memory budget first, with its
// own buffers, in one piece. A 4 KiB tensor on a ring: 12 KiB for the
// reduce itself (gossip samples no error), 24 KiB more for the round (2
// messages each way, this end's and the neighbour's x).
TEST_F(EngineGossipTest, TheMessagesCountAgainstTheMemoryBudget) {
  const GossipSpec spec{"ring"};
  for (const uint64_t budget : {32 << 10, 48 << 10}) {
    options_.memory_budget_bytes = budget;
    Restart();
    std::vector<absl::Status> status(kWorld);
    std::vector<std::thread> threads;
    for (int r = 0; r < kWorld; ++r) {
      threads.emplace_back([&, r] {
        const std::string data = Bytes(Random(1024, r));
        status[r] = engines_[r]->Reduce(Input(data, {1024}, 0, spec)).status();
      });
    }
    for (std::thread& t : threads) t.join();
    for (int r = 0; r < kWorld; ++r) {
      if (budget == (48 << 10)) {
        EXPECT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
        continue;
      }
      EXPECT_EQ(status[r].code(), absl::StatusCode::kResourceExhausted)
          << status[r];
      EXPECT_THAT(status[r].message(),
                  HasSubstr("this reduce, its gossip messages and copies "
                            "included, needs 36864 bytes"))
          << status[r];
    }
  }
}

TEST_F(EngineGossipTest, ExactGossipMixesWithTheRingNeighbours) {
  std::vector<std::vector<float>> xs;
  for (int r = 0; r < kWorld; ++r) xs.push_back(Random(12, r));
  const std::vector<std::vector<float>> before = xs;
  Rounds(xs, {3, 4}, {"ring"}, 0, 1);
  for (int r = 0; r < kWorld; ++r) {
    const int left = (r + kWorld - 1) % kWorld, right = (r + 1) % kWorld;
    for (size_t i = 0; i < 12; ++i) {
      const double want =
          (before[left][i] + before[r][i] + before[right][i]) / 3.0;
      EXPECT_NEAR(xs[r][i], want, 1e-6) << "rank " << r << " index " << i;
    }
    EXPECT_EQ(last_stats_[r].codec, "gossip");
    // One plain message (32-byte header + 12 floats) to each of 2 neighbours.
    EXPECT_EQ(last_stats_[r].wire_bytes, 2u * (32 + 12 * 4));
    EXPECT_EQ(
        MetricValue(*metrics_[r]->collectable(), "gradcomp_gossip_bytes_total",
                    {{"peer", std::to_string(right)}}),
        32 + 12 * 4);
  }
}

TEST_F(EngineGossipTest, PowerGossipKeepsTheMeanAndItsEdgesInTheJobState) {
  const GossipSpec spec{"ring", 2, 2, 1.308};
  std::vector<std::vector<float>> xs;
  for (int r = 0; r < kWorld; ++r) xs.push_back(Random(8 * 6, 10 + r));
  std::vector<double> sum(48, 0.0);
  for (const auto& x : xs) {
    for (size_t i = 0; i < x.size(); ++i) sum[i] += x[i];
  }
  const double start = ConsensusDistance(xs);
  Rounds(xs, {8, 6}, spec, 0, 3);
  EXPECT_EQ(last_stats_[0].codec, "powergossip");
  for (size_t i = 0; i < 48; ++i) {
    double s = 0;
    for (const auto& x : xs) s += x[i];
    EXPECT_NEAR(s, sum[i], 1e-5) << "index " << i;
  }
  EXPECT_LT(ConsensusDistance(xs), 0.9 * start);

  // Every daemon restarts with its exported state: the next rounds are
  // the ones an uninterrupted run gives, bit for bit.
  std::vector<std::string> states;
  for (int r = 0; r < kWorld; ++r) {
    absl::StatusOr<std::string> state = engines_[r]->ExportState("job");
    ASSERT_TRUE(state.ok()) << state.status();
    states.push_back(*state);
  }
  EXPECT_THAT(states[2], HasSubstr("gossip.1.q"));
  std::vector<std::vector<float>> restarted = xs;
  Rounds(xs, {8, 6}, spec, 3, 2);
  Restart();
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(engines_[r]->ImportState("job", states[r]).ok());
  }
  Rounds(restarted, {8, 6}, spec, 3, 2);
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(0, std::memcmp(xs[r].data(), restarted[r].data(),
                             xs[r].size() * sizeof(float)))
        << "rank " << r;
  }
}

TEST_F(EngineGossipTest, ChocoKeepsTheMeanSendsTopKAndResumesFromItsState) {
  // 10 % of 60 entries: 6 (index, value) pairs per neighbour and round.
  const GossipSpec spec{"ring", 0, 1, 0.2, 0.1};
  std::vector<std::vector<float>> xs;
  for (int r = 0; r < kWorld; ++r) xs.push_back(Random(60, 20 + r));
  std::vector<double> sum(60, 0.0);
  for (const auto& x : xs) {
    for (size_t i = 0; i < x.size(); ++i) sum[i] += x[i];
  }
  const double start = ConsensusDistance(xs);
  Rounds(xs, {6, 10}, spec, 0, 20);
  EXPECT_EQ(last_stats_[0].codec, "choco-topk");
  EXPECT_EQ(last_stats_[0].wire_bytes, 2u * (32 + 6 * 8));
  for (size_t i = 0; i < 60; ++i) {
    double s = 0;
    for (const auto& x : xs) s += x[i];
    EXPECT_NEAR(s, sum[i], 1e-5) << "index " << i;
  }
  EXPECT_LT(ConsensusDistance(xs), 0.5 * start);

  std::vector<std::string> states;
  for (int r = 0; r < kWorld; ++r) {
    absl::StatusOr<std::string> state = engines_[r]->ExportState("job");
    ASSERT_TRUE(state.ok()) << state.status();
    states.push_back(*state);
  }
  EXPECT_THAT(states[2], HasSubstr("gossip.1.hat"));
  std::vector<std::vector<float>> restarted = xs;
  Rounds(xs, {6, 10}, spec, 20, 3);
  Restart();
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(engines_[r]->ImportState("job", states[r]).ok());
  }
  Rounds(restarted, {6, 10}, spec, 20, 3);
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(0, std::memcmp(xs[r].data(), restarted[r].data(),
                             xs[r].size() * sizeof(float)))
        << "rank " << r;
  }
}

// Rank 2 goes back to an older state of its job (an older checkpoint):
// its PowerGossip edges are behind its neighbours'. The next round starts
// those two edges again at both ends: it succeeds on every rank, keeps the
// network sum, and both ends of each edge count it once.
// The edges' state is fp32 whatever the tensor's dtype, and both ends of an
// edge must keep it: a rank that switches its tensor to bf16 (mixed
// precision from some step on) keeps its Choco copies, which its
// neighbours hold too, and so keeps gossiping with them.
TEST_F(EngineGossipTest, ARankThatChangesDtypeKeepsItsEdges) {
  const GossipSpec spec{"ring", 0, 1, 0.2, 0.1};
  std::vector<std::vector<float>> xs;
  for (int r = 0; r < kWorld; ++r) xs.push_back(Random(60, 40 + r));
  Rounds(xs, {6, 10}, spec, 0, 3);
  dtypes_[1] = DType::kBFloat16;
  Rounds(xs, {6, 10}, spec, 3, 3);
  EXPECT_EQ(stores_[1]->resets(), 0u);
}

TEST_F(EngineGossipTest, AnEdgeOutOfStepIsStartedAgainAndCounted) {
  const GossipSpec spec{"ring", 2, 1, 1.0};
  std::vector<std::vector<float>> xs;
  for (int r = 0; r < kWorld; ++r) xs.push_back(Random(8 * 6, 20 + r));
  Rounds(xs, {8, 6}, spec, 0, 1);
  absl::StatusOr<std::string> older = engines_[2]->ExportState("job");
  ASSERT_TRUE(older.ok()) << older.status();
  Rounds(xs, {8, 6}, spec, 1, 2);
  ASSERT_TRUE(engines_[2]->ImportState("job", *older).ok());
  std::vector<double> sum(48, 0.0);
  for (const auto& x : xs) {
    for (size_t i = 0; i < x.size(); ++i) sum[i] += x[i];
  }
  Rounds(xs, {8, 6}, spec, 3, 3);
  for (size_t i = 0; i < 48; ++i) {
    double s = 0;
    for (const auto& x : xs) s += x[i];
    EXPECT_NEAR(s, sum[i], 1e-5) << "index " << i;
  }
  auto resyncs = [&](int r, int peer) {
    return MetricValue(*metrics_[r]->collectable(),
                       "gradcomp_gossip_edge_resyncs_total",
                       {{"peer", std::to_string(peer)}});
  };
  EXPECT_EQ(resyncs(1, 2), 1);
  EXPECT_EQ(resyncs(3, 2), 1);
  EXPECT_EQ(resyncs(2, 1), 1);
  EXPECT_EQ(resyncs(2, 3), 1);
  EXPECT_EQ(resyncs(0, 1), 0);
  EXPECT_EQ(resyncs(0, 3), 0);
}

TEST_F(EngineGossipTest, EqualInputsComeBackUnchanged) {
  const std::vector<float> same = Random(5 * 7, 3);
  std::vector<std::vector<float>> xs(kWorld, same);
  Rounds(xs, {5, 7}, {"full", 1, 2}, 0, 2);
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(xs[r], same) << "rank " << r;
}

TEST_F(EngineGossipTest, ExportsTheReportedConsensusDistance) {
  std::vector<std::vector<float>> xs(kWorld, Random(6, 1));
  reported_distance_ = 0.25;
  Rounds(xs, {6}, {"ring"}, 0, 1);
  EXPECT_EQ(MetricValue(*metrics_[0]->collectable(),
                        "gradcomp_gossip_consensus_distance",
                        {{"gradcomp_job", "job"}}),
            0.25);
}

// Once every rank has released a gossip job, the same name runs again
// from step 0 on another topology as on new daemons: the edges' factors,
// the checked spec, the rendezvous steps and the reported distance are gone.
TEST_F(EngineGossipTest, AReleasedJobRunsAgainAsOnNewDaemons) {
  const GossipSpec ring{"ring", 1};
  const GossipSpec full{"full", 2};
  std::vector<std::vector<float>> xs;
  for (int r = 0; r < kWorld; ++r) xs.push_back(Random(8 * 6, 20 + r));
  const std::vector<std::vector<float>> start = xs;
  reported_distance_ = 0.5;
  Rounds(xs, {8, 6}, ring, 0, 3);
  reported_distance_ = 0;
  for (int r = 0; r < kWorld; ++r) {
    absl::StatusOr<ReleasedJob> released = engines_[r]->ReleaseJob("job");
    ASSERT_TRUE(released.ok()) << released.status();
    EXPECT_EQ(released->tensors, 1u);
    EXPECT_GT(released->state_bytes, 0u);
    EXPECT_EQ(stores_[r]->ByteSize(), 0u);
    EXPECT_EQ(MetricValue(*metrics_[r]->collectable(),
                          "gradcomp_gossip_consensus_distance",
                          {{"gradcomp_job", "job"}}),
              0);
  }

  std::vector<std::vector<float>> again = start;
  Rounds(again, {8, 6}, full, 0, 2);
  Restart();
  std::vector<std::vector<float>> fresh = start;
  Rounds(fresh, {8, 6}, full, 0, 2);
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(0, std::memcmp(again[r].data(), fresh[r].data(),
                             again[r].size() * sizeof(float)))
        << "rank " << r;
  }
}

// A job's first gossip request waits in its spec check for the other ranks;
// its job is busy meanwhile, so ReleaseJob is refused as for any reduce in
// flight. Before, the release was accepted and freed the node the request
// went on to use (a use-after-free: it read a garbage working size).
TEST_F(EngineGossipTest, AJobInItsSpecCheckIsBusyAndNotReleased) {
  const GossipSpec ring{"ring", 1};
  std::vector<std::vector<float>> xs;
  for (int r = 0; r < kWorld; ++r) xs.push_back(Random(8 * 6, 40 + r));
  absl::StatusOr<ReduceOutput> first;
  std::thread checking([&] {
    first = engines_[0]->Reduce(Input(Bytes(xs[0]), {8, 6}, 0, ring));
  });
  const absl::Time give_up = absl::Now() + absl::Seconds(20);
  while (MetricValue(*metrics_[0]->collectable(), "gradcomp_jobs_active", {}) <
         1) {
    ASSERT_LT(absl::Now(), give_up) << "rank 0's request never took its job";
    absl::SleepFor(absl::Milliseconds(5));
  }
  const absl::Status released = engines_[0]->ReleaseJob("job").status();
  EXPECT_EQ(released.code(), absl::StatusCode::kFailedPrecondition) << released;
  std::vector<std::thread> others;
  for (int r = 1; r < kWorld; ++r) {
    others.emplace_back([&, r] {
      absl::StatusOr<ReduceOutput> out =
          engines_[r]->Reduce(Input(Bytes(xs[r]), {8, 6}, 0, ring));
      EXPECT_TRUE(out.ok()) << "rank " << r << ": " << out.status();
    });
  }
  for (std::thread& t : others) t.join();
  checking.join();
  EXPECT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(engines_[0]->ReleaseJob("job").ok());
}

// A mix that extrapolates (diffusion 2.7) past what fp16 holds fails the
// round on every rank, naming fp16's largest value, and keeps the edges:
// before, the fp32 mix was in range, so the round succeeded and fp16 gave
// back Inf.
TEST_F(EngineGossipTest, AMixBeyondTheTensorsDtypeFailsAndKeepsTheEdges) {
  const GossipSpec spec{"ring", 1, 1, 2.7};
  for (DType& dtype : dtypes_) dtype = DType::kFloat16;
  std::vector<std::vector<float>> xs;
  for (int r = 0; r < kWorld; ++r) xs.push_back(Random(4, 60 + r));
  Rounds(xs, {4, 1}, spec, 0, 1);
  std::vector<std::string> before;
  for (int r = 0; r < kWorld; ++r) {
    absl::StatusOr<std::string> state = engines_[r]->ExportState("job");
    ASSERT_TRUE(state.ok()) << state.status();
    before.push_back(*state);
  }
  std::vector<absl::Status> status(kWorld);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      const std::vector<float> far(4, r % 2 == 0 ? 60000.0f : -60000.0f);
      absl::StatusOr<std::string> data = EncodeFromFloat(DType::kFloat16, far);
      ASSERT_TRUE(data.ok()) << data.status();
      ReduceInput in = Input(*data, {4, 1}, 1, spec);
      in.dtype = DType::kFloat16;
      status[r] = engines_[r]->Reduce(in).status();
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(status[r].code(), absl::StatusCode::kInvalidArgument)
        << "rank " << r << ": " << status[r];
    EXPECT_THAT(std::string(status[r].message()),
                HasSubstr("which it holds as Inf from a magnitude of 65520"));
    absl::StatusOr<std::string> after = engines_[r]->ExportState("job");
    ASSERT_TRUE(after.ok()) << after.status();
    EXPECT_EQ(*after, before[r]) << "rank " << r;
  }
}

TEST_F(EngineGossipTest, RefusesMixedModesBatchesAndBadDistances) {
  std::vector<std::vector<float>> xs;
  for (int r = 0; r < kWorld; ++r) xs.push_back(Random(6, r));
  Rounds(xs, {6}, {"ring"}, 0, 1);
  const std::string data = Bytes(xs[0]);
  ReduceInput average = Input(data, {6}, 1, {});
  average.mode = ReduceMode::kAverage;
  EXPECT_THAT(engines_[0]->Reduce(average).status().message(),
              HasSubstr("job 'job' reduces in gossip mode on this daemon"));
  ReduceInput batched = Input(data, {6}, 1, {"ring"});
  batched.batch = std::make_shared<const BatchSpec>(*MakeBatchSpec("b", {"w"}));
  EXPECT_THAT(engines_[0]->Reduce(batched).status().message(),
              HasSubstr("gossip has no SUM rounds to batch"));
  ReduceInput nan = Input(data, {6}, 1, {"ring"});
  nan.consensus_distance = -1;
  EXPECT_THAT(engines_[0]->Reduce(nan).status().message(),
              HasSubstr("consensus_distance is -1, expected a finite value"));
}

// An empty tensor has nothing to mix, but its request is held to the job's
// mode and gossip spec like any other.
TEST_F(EngineGossipTest, AnEmptyTensorIsHeldToTheJobsModeAndSpec) {
  std::vector<std::vector<float>> xs;
  for (int r = 0; r < kWorld; ++r) xs.push_back(Random(6, r));
  Rounds(xs, {6}, {"ring"}, 0, 1);
  ReduceInput same = Input("", {0}, 1, {"ring"});
  same.tensor = "empty";
  EXPECT_TRUE(engines_[0]->Reduce(same).ok());
  ReduceInput other = Input("", {0}, 1, {"full"});
  other.tensor = "empty";
  EXPECT_THAT(engines_[0]->Reduce(other).status().message(),
              HasSubstr("but this request names"));

  ReduceInput average = Input("", {0}, 0, {});
  average.job = "averaged";
  average.mode = ReduceMode::kAverage;
  ASSERT_TRUE(engines_[0]->Reduce(average).ok());
  ReduceInput gossip = Input("", {0}, 1, {"ring"});
  gossip.job = "averaged";
  EXPECT_THAT(engines_[0]->Reduce(gossip).status().message(),
              HasSubstr("reduces in average mode on this daemon"));
}

}  // namespace
}  // namespace gradcomp::service
