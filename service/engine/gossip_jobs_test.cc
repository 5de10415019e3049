#include "service/engine/gossip_jobs.h"

#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/collective/in_process_group.h"

namespace gradcomp::service {
namespace {

using ::testing::HasSubstr;

// Node(job, specs[r]) on every rank r of an in-process group at once.
std::vector<absl::StatusOr<GossipNode*>> NodeOnEveryRank(
    std::vector<std::unique_ptr<GossipJobs>>& jobs, const std::string& job,
    const std::vector<GossipSpec>& specs) {
  std::vector<absl::StatusOr<GossipNode*>> got(jobs.size(),
                                               absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (size_t r = 0; r < jobs.size(); ++r) {
    threads.emplace_back([&, r] { got[r] = jobs[r]->Node(job, specs[r]); });
  }
  for (std::thread& t : threads) t.join();
  return got;
}

class GossipJobsTest : public ::testing::Test {
 protected:
  explicit GossipJobsTest(int world = 4) : group_(world, absl::Seconds(10)) {
    for (int r = 0; r < world; ++r) {
      jobs_.push_back(std::make_unique<GossipJobs>(&group_.collective(r), 7));
    }
  }
  InProcessGroup group_;
  std::vector<std::unique_ptr<GossipJobs>> jobs_;
};

TEST(GossipSpecTest, DefaultsAndRanges) {
  absl::StatusOr<GossipOptions> exact = GossipOptionsFromSpec({"ring"});
  ASSERT_TRUE(exact.ok()) << exact.status();
  EXPECT_EQ(exact->mode, GossipOptions::Mode::kExact);
  EXPECT_EQ(exact->iterations, 1);
  EXPECT_EQ(exact->exact_gamma, 1.0);
  absl::StatusOr<GossipOptions> power =
      GossipOptionsFromSpec({"torus", 2, 3, 1.308});
  ASSERT_TRUE(power.ok()) << power.status();
  EXPECT_EQ(power->mode, GossipOptions::Mode::kPowerGossip);
  EXPECT_EQ(power->rank, 2);
  EXPECT_EQ(power->iterations, 3);
  EXPECT_EQ(power->gamma, 1.308);
  EXPECT_EQ(DescribeGossipSpec({"ring"}),
            "topology 'ring', rank 0 (exact gossip), 1 power step(s), "
            "diffusion 1");
  absl::StatusOr<GossipOptions> choco =
      GossipOptionsFromSpec({"ring", 0, 0, 0.05, 0.02});
  ASSERT_TRUE(choco.ok()) << choco.status();
  EXPECT_EQ(choco->mode, GossipOptions::Mode::kChoco);
  EXPECT_EQ(choco->choco_fraction, 0.02);
  EXPECT_EQ(choco->gamma, 0.05);
  EXPECT_EQ(DescribeGossipSpec({"ring", 0, 0, 0.05, 0.02}),
            "topology 'ring', Choco-Gossip top-k 0.02, 1 step(s), diffusion "
            "0.05");
  // Ranks compare descriptions: rates that differ past six digits differ.
  EXPECT_NE(DescribeGossipSpec({"ring", 1, 1, 1.308}),
            DescribeGossipSpec({"ring", 1, 1, 1.3080049}));
  EXPECT_NE(DescribeGossipSpec({"ring", 0, 0, 0.05, 0.02}),
            DescribeGossipSpec({"ring", 0, 0, 0.05, 0.0200001}));
  EXPECT_THAT(
      GossipOptionsFromSpec({"ring", 1, 0, 0.05, 0.02}).status().message(),
      HasSubstr("gossip.choco_topk_fraction is 0.02 and gossip.rank 1: "
                "Choco-Gossip and PowerGossip exclude each other"));
  EXPECT_THAT(
      GossipOptionsFromSpec({"ring", 0, 0, 0.05, 1.5}).status().message(),
      HasSubstr("gossip.choco_topk_fraction is 1.5, expected 0 (no "
                "Choco-Gossip) or the share of each tensor's entries sent per "
                "round, in (0, 1]"));
  EXPECT_THAT(GossipOptionsFromSpec({}).status().message(),
              HasSubstr("gossip mode needs gossip.topology"));
  EXPECT_THAT(GossipOptionsFromSpec({"ring", 0, 1, 2.5}).status().message(),
              HasSubstr("gossip.diffusion is 2.5, expected a step size in "
                        "(0, 2] for exact gossip and Choco-Gossip"));
  EXPECT_THAT(
      GossipOptionsFromSpec({"ring", 0, 0, 2.5, 0.02}).status().message(),
      HasSubstr("gossip.diffusion is 2.5, expected a step size in (0, 2]"));
  EXPECT_THAT(GossipOptionsFromSpec({"ring", 1, 1, -1}).status().message(),
              HasSubstr("gossip.diffusion is -1, expected a step size > 0"));
  // PowerGossip's bound needs the topology (Node); above 2, its 1-D
  // tensors gossip exactly at 1.
  absl::StatusOr<GossipOptions> fast =
      GossipOptionsFromSpec({"ring", 1, 1, 2.5});
  ASSERT_TRUE(fast.ok()) << fast.status();
  EXPECT_EQ(fast->gamma, 2.5);
  EXPECT_EQ(fast->exact_gamma, 1.0);
  EXPECT_THAT(GossipOptionsFromSpec({"ring", 2000}).status().message(),
              HasSubstr("gossip.rank is 2000"));
}

TEST(GossipSpecTest, FreshFactorsOnlyForPowerGossip) {
  GossipSpec fresh{"ring", 2, 1, 1.308};
  EXPECT_TRUE(GossipOptionsFromSpec(fresh)->warm_start);
  fresh.fresh_factors = true;
  absl::StatusOr<GossipOptions> options = GossipOptionsFromSpec(fresh);
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_FALSE(options->warm_start);
  // Ranks compare the description, so one that asks for fresh factors
  // while the others warm-start is refused naming both.
  EXPECT_EQ(DescribeGossipSpec(fresh),
            "topology 'ring', rank 2, 1 power step(s), diffusion 1.308, "
            "fresh factors every round");
  fresh.rank = 0;
  EXPECT_THAT(GossipOptionsFromSpec(fresh).status().message(),
              HasSubstr("gossip.fresh_factors is set with gossip.rank 0: "
                        "fresh factors every round are a PowerGossip option, "
                        "expected rank > 0 without a Choco fraction"));
  fresh.choco_topk_fraction = 0.05;
  EXPECT_THAT(GossipOptionsFromSpec(fresh).status().message(),
              HasSubstr("gossip.fresh_factors is set with gossip.rank 0 and "
                        "gossip.choco_topk_fraction 0.05: fresh factors"));
}

TEST_F(GossipJobsTest, RanksThatAgreeGetOneNodePerJob) {
  const GossipSpec ring{"ring", 1};
  auto got = NodeOnEveryRank(jobs_, "job", std::vector<GossipSpec>(4, ring));
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(got[r].ok()) << got[r].status();
    EXPECT_EQ((*got[r])->topology().neighbours(r).size(), 2u);
  }
  // Later calls return the same node without meeting the other ranks.
  absl::StatusOr<GossipNode*> again = jobs_[2]->Node("job", ring);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *got[2]);
}

TEST_F(GossipJobsTest, WorkingBytesAheadBeforeAndAfterTheJobsNode) {
  // PowerGossip r = 2 on a ring of 4 (2 neighbours), an [8, 6] tensor: per
  // edge 4 factor-sized buffers of (8 + 6) x 2 floats, and the tensor.
  const GossipSpec ring{"ring", 2};
  const std::vector<int64_t> shape = {8, 6};
  constexpr uint64_t kBytes = 2 * 4 * (8 + 6) * 2 * 4 + 8 * 6 * 4;
  EXPECT_EQ(jobs_[0]->WorkingBytesAhead("job", ring, shape), kBytes);
  auto got = NodeOnEveryRank(jobs_, "job", std::vector<GossipSpec>(4, ring));
  ASSERT_TRUE(got[0].ok()) << got[0].status();
  EXPECT_EQ(jobs_[0]->WorkingBytesAhead("job", ring, shape), kBytes);
  EXPECT_EQ((*got[0])->WorkingBytes(shape), kBytes);
  // Another spec than the node's is estimated by its own (the request will
  // be refused); one that does not parse, or does not fit 4 workers, is 0.
  EXPECT_EQ(jobs_[0]->WorkingBytesAhead("job", GossipSpec{"full"}, shape),
            (2 * 3 + 2) * 8 * 6 * 4);
  EXPECT_EQ(jobs_[0]->WorkingBytesAhead("job", GossipSpec{"star"}, shape), 0);
  EXPECT_EQ(jobs_[0]->WorkingBytesAhead("job", GossipSpec{"torus:3x3"}, shape),
            0);
  EXPECT_EQ(jobs_[0]->WorkingBytesAhead("job", GossipSpec{"ring", 5000}, shape),
            0);
}

TEST_F(GossipJobsTest, RanksThatDisagreeAreRefusedNamingBoth) {
  std::vector<GossipSpec> specs(4, GossipSpec{"ring", 1});
  specs[3].topology = "full";
  auto got = NodeOnEveryRank(jobs_, "job", specs);
  EXPECT_EQ(got[0].status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(got[0].status().message(),
              HasSubstr("job 'job': ranks disagree on the gossip spec: rank 0 "
                        "has topology 'ring', rank 1, 1 power step(s), "
                        "diffusion 1, rank 3 has topology 'full'"));
  EXPECT_THAT(got[3].status().message(),
              HasSubstr("rank 3 has topology 'full', rank 1, 1 power step(s), "
                        "diffusion 1, rank 0 has topology 'ring'"));
  // Once all agree, the next check passes.
  got = NodeOnEveryRank(jobs_, "job",
                        std::vector<GossipSpec>(4, GossipSpec{"full", 1}));
  for (int r = 0; r < 4; ++r) EXPECT_TRUE(got[r].ok()) << got[r].status();
}

TEST_F(GossipJobsTest, APowerGossipDiffusionAboveTheEdgeBoundIsRefused) {
  // Ring of 4: every edge weighs 1/3, so PowerGossip needs diffusion < 3.
  auto got = NodeOnEveryRank(
      jobs_, "job", std::vector<GossipSpec>(4, GossipSpec{"ring", 1, 1, 3}));
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(got[r].status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(got[r].status().message(),
                HasSubstr("job 'job': gossip.diffusion for 4 workers: "
                          "PowerGossip diffusion 3 on topology 'ring' "
                          "(largest edge weight 0.333333): expected gamma < "
                          "1 / 0.333333 = 3"));
  }
  got = NodeOnEveryRank(
      jobs_, "job2", std::vector<GossipSpec>(4, GossipSpec{"ring", 1, 1, 2.9}));
  for (int r = 0; r < 4; ++r) EXPECT_TRUE(got[r].ok()) << got[r].status();
}

TEST_F(GossipJobsTest, PlainGossipOnlyAtARateThatConverges) {
  // Ring of 4: each rank's edges weigh 2/3 together, so plain gossip needs
  // a diffusion < 1.5.
  auto got = NodeOnEveryRank(
      jobs_, "exact",
      std::vector<GossipSpec>(4, GossipSpec{"ring", 0, 1, 1.6}));
  for (int r = 0; r < 4; ++r) {
    EXPECT_THAT(got[r].status().message(),
                HasSubstr("job 'exact': gossip.diffusion for 4 workers: exact "
                          "gossip diffusion 1.6 on topology 'ring'"));
  }
  // A PowerGossip job there keeps 1.6 for its matrices and mixes its 1-D
  // tensors with the mixing matrix itself; at 1.4 it uses 1.4 for both.
  got = NodeOnEveryRank(
      jobs_, "power",
      std::vector<GossipSpec>(4, GossipSpec{"ring", 1, 1, 1.6}));
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(got[r].ok()) << got[r].status();
    EXPECT_EQ((*got[r])->options().gamma, 1.6);
    EXPECT_EQ((*got[r])->options().exact_gamma, 1.0);
  }
  got = NodeOnEveryRank(
      jobs_, "slow", std::vector<GossipSpec>(4, GossipSpec{"ring", 1, 1, 1.4}));
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(got[r].ok()) << got[r].status();
    EXPECT_EQ((*got[r])->options().exact_gamma, 1.4);
  }
}

// `rounds` PowerGossip rounds of tensor "x" (shape `shape`) on every rank's
// node at once, from `xs`, in place.
void RunRounds(InProcessGroup& group,
               std::vector<absl::StatusOr<GossipNode*>>& nodes,
               const std::string& job, int rounds,
               const std::vector<int64_t>& shape,
               std::vector<std::vector<float>>& xs) {
  for (int step = 0; step < rounds; ++step) {
    std::vector<std::thread> threads;
    for (size_t r = 0; r < nodes.size(); ++r) {
      threads.emplace_back([&, r] {
        absl::StatusOr<GossipStats> stats = (*nodes[r])->Round(
            group.collective(static_cast<int>(r)), {job, "x", step, 0}, shape,
            absl::MakeSpan(xs[r]));
        EXPECT_TRUE(stats.ok()) << stats.status();
      });
    }
    for (std::thread& t : threads) t.join();
  }
}

TEST_F(GossipJobsTest, FreshFactorsReachTheNode) {
  GossipSpec warm_spec{"ring", 1, 1, 1.308};
  GossipSpec fresh_spec = warm_spec;
  fresh_spec.fresh_factors = true;
  auto warm =
      NodeOnEveryRank(jobs_, "warm", std::vector<GossipSpec>(4, warm_spec));
  auto fresh =
      NodeOnEveryRank(jobs_, "fresh", std::vector<GossipSpec>(4, fresh_spec));
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(warm[r].ok()) << warm[r].status();
    ASSERT_TRUE(fresh[r].ok()) << fresh[r].status();
    EXPECT_TRUE((*warm[r])->options().warm_start);
    EXPECT_FALSE((*fresh[r])->options().warm_start);
  }
  const std::vector<int64_t> shape = {6, 5};
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  std::vector<std::vector<float>> start(4, std::vector<float>(30));
  for (auto& x : start) {
    for (float& v : x) v = normal(rng);
  }
  // The first round draws the same factors either way (the edge's stream
  // does not depend on the job); the second starts warm from the first's
  // factors, or fresh from a new draw.
  std::vector<std::vector<float>> xw = start, xf = start;
  RunRounds(group_, warm, "warm", 1, shape, xw);
  RunRounds(group_, fresh, "fresh", 1, shape, xf);
  EXPECT_EQ(xw, xf);
  RunRounds(group_, warm, "warm", 1, shape, xw);
  RunRounds(group_, fresh, "fresh", 1, shape, xf);
  EXPECT_NE(xw, xf);
  // Both ends of every edge still hold the same fresh factors, bit for bit.
  for (int r = 0; r < 4; ++r) {
    for (const Neighbour& n : (*fresh[r])->topology().neighbours(r)) {
      absl::StatusOr<EdgeFactors> mine = (*fresh[r])->Factors("x", n.rank);
      absl::StatusOr<EdgeFactors> theirs = (*fresh[n.rank])->Factors("x", r);
      ASSERT_TRUE(mine.ok() && theirs.ok());
      EXPECT_EQ(mine->power_steps, 2u);
      EXPECT_EQ(mine->p, theirs->p) << r << "-" << n.rank;
      EXPECT_EQ(mine->q, theirs->q) << r << "-" << n.rank;
    }
  }
}

TEST_F(GossipJobsTest, ATopologyThatDoesNotFitTheWorldIsRefused) {
  auto got =
      NodeOnEveryRank(jobs_, "job", std::vector<GossipSpec>(4, {"torus:3x3"}));
  EXPECT_EQ(got[1].status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(got[1].status().message(),
              HasSubstr("job 'job': gossip topology 'torus:3x3' for 4 "
                        "workers: "));
}

TEST_F(GossipJobsTest, AJobKeepsItsModeAndSpec) {
  auto got =
      NodeOnEveryRank(jobs_, "job", std::vector<GossipSpec>(4, {"ring", 1}));
  ASSERT_TRUE(got[0].ok()) << got[0].status();
  EXPECT_THAT(jobs_[0]->Node("job", {"ring", 2}).status().message(),
              HasSubstr("job 'job' gossips with topology 'ring', rank 1, 1 "
                        "power step(s), diffusion 1 on this daemon, but this "
                        "request names topology 'ring', rank 2"));
  EXPECT_THAT(jobs_[0]->CheckAverage("job").message(),
              HasSubstr("job 'job' reduces in gossip mode on this daemon; a "
                        "request in average mode was refused"));
  EXPECT_TRUE(jobs_[0]->CheckAverage("other").ok());
  EXPECT_THAT(jobs_[0]->Node("other", {"ring"}).status().message(),
              HasSubstr("job 'other' reduces in average mode on this daemon"));
}

// A topology or diffusion that this rank can tell is wrong alone is refused
// at once, without waiting for the other ranks' specs (the group's deadline
// is long: before, the typo was reported as a deadline naming the idle
// ranks, never by name).
TEST(GossipJobsAloneTest, ABadTopologyOrDiffusionIsRefusedWithoutTheOthers) {
  InProcessGroup group(4, absl::Minutes(10));
  GossipJobs rank0(&group.collective(0), 7);
  const absl::Status typo = rank0.Node("job", {"rnig"}).status();
  EXPECT_EQ(typo.code(), absl::StatusCode::kInvalidArgument) << typo;
  EXPECT_THAT(typo.message(), HasSubstr("gossip topology 'rnig' for 4"));
  GossipSpec unstable{"ring"};
  unstable.diffusion = 1.8;  // exact gossip on a ring of 4: below 1.5
  const absl::Status rate = rank0.Node("job", unstable).status();
  EXPECT_EQ(rate.code(), absl::StatusCode::kInvalidArgument) << rate;
  EXPECT_THAT(rate.message(), HasSubstr("gossip.diffusion for 4 workers"));
}

// A rank whose check gave up because another came later passes on the
// message that rank sent when it came: the only one it sends, since it
// passed on this rank's first message and checks no more. Every rank comes
// alone, so the checks that fail find no message and the ones that pass
// find them all (the in-process hub delivers as it sends): the deadline
// only ends the failing ones.
TEST(GossipJobsLateTest, ARankWhoseCheckGaveUpPassesOnOneThatPassed) {
  InProcessGroup group(2, absl::Milliseconds(50));
  GossipJobs rank0(&group.collective(0), 7);
  GossipJobs rank1(&group.collective(1), 7);
  const GossipSpec full{"full", 1};
  absl::Status alone = rank0.Node("job", full).status();
  EXPECT_EQ(alone.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(alone.message(),
              HasSubstr("job 'job': the gossip spec check with rank 1 failed "
                        "(expected every rank to make a gossip request of the "
                        "job; "));
  EXPECT_THAT(alone.message(), HasSubstr("no message from rank 1"));
  absl::StatusOr<GossipNode*> on_time = rank1.Node("job", full);
  ASSERT_TRUE(on_time.ok()) << on_time.status();
  absl::StatusOr<GossipNode*> late = rank0.Node("job", full);
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_EQ((*late)->topology().neighbours(0).size(), 1u);

  // A late rank with another spec is still refused, naming both, by the
  // rank that came later and by itself when it comes back.
  const GossipSpec ring{"ring", 2};
  EXPECT_EQ(rank0.Node("other", ring).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(rank1.Node("other", full).status().message(),
              HasSubstr("job 'other': ranks disagree on the gossip spec: "
                        "rank 1 has topology 'full', rank 1, 1 power step(s), "
                        "diffusion 1, rank 0 has topology 'ring', rank 2"));
  EXPECT_THAT(rank0.Node("other", ring).status().message(),
              HasSubstr("job 'other': ranks disagree on the gossip spec: "
                        "rank 0 has topology 'ring', rank 2, 1 power step(s), "
                        "diffusion 1, rank 1 has topology 'full', rank 1"));
}

// Three ranks, each alone: a rank keeps what its failed checks did get. Rank
// 1's first check gets rank 0's spec and gives up on rank 2's; rank 2 then
// passes on both. Rank 1 comes back and needs only rank 2's spec, which
// waits for it: had its failed check used up rank 0's (rank 0 has not passed
// yet, but it would send it again) or a retry of it used up rank 2's (rank 2
// will not), it would wait for them until a restart.
TEST(GossipJobsLateTest, RanksThatComeOneByOneAllPass) {
  InProcessGroup group(3, absl::Milliseconds(50));
  std::vector<std::unique_ptr<GossipJobs>> jobs;
  for (int r = 0; r < 3; ++r) {
    jobs.push_back(std::make_unique<GossipJobs>(&group.collective(r), 7));
  }
  const GossipSpec ring{"ring", 1};
  absl::Status alone = jobs[0]->Node("job", ring).status();
  EXPECT_EQ(alone.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(alone.message(),
              HasSubstr("the gossip spec check with ranks 1, 2 failed"));
  EXPECT_EQ(jobs[1]->Node("job", ring).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  for (int r : {2, 1, 0}) {
    absl::StatusOr<GossipNode*> node = jobs[r]->Node("job", ring);
    ASSERT_TRUE(node.ok()) << "rank " << r << ": " << node.status();
    EXPECT_EQ((*node)->topology().neighbours(r).size(), 2u);
  }
}

}  // namespace
}  // namespace gradcomp::service
