#include "service/gossip/power_gossip.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/collective/in_process_group.h"
#include "service/collective/local_collective.h"
#include "service/gossip/topology.h"

namespace gradcomp::service {
namespace {

using ::testing::HasSubstr;
using Mode = GossipOptions::Mode;

constexpr uint64_t kSeed = 42;

// W gossip nodes over one in-process group; each Rounds() call runs every
// rank's rounds on its own thread, as W daemons would.
class Network {
 public:
  Network(const Topology& topology, GossipOptions options,
          absl::Duration timeout = absl::Seconds(60))
      : group_(topology.world_size(), timeout),
        bytes_(topology.world_size()),
        resynced_(topology.world_size()) {
    for (int r = 0; r < topology.world_size(); ++r) {
      nodes_.push_back(
          std::make_unique<GossipNode>(topology, r, options, kSeed));
    }
  }

  int world_size() const { return static_cast<int>(nodes_.size()); }
  GossipNode& node(int r) { return *nodes_[r]; }
  void ResetNode(int r) {
    nodes_[r] = std::make_unique<GossipNode>(nodes_[r]->topology(), r,
                                             nodes_[r]->options(), kSeed);
  }

  // Rounds [first, first + count) of `tensor` on every rank in `ranks`
  // (all when empty); statuses by rank.
  std::vector<absl::Status> Rounds(const std::string& tensor,
                                   const std::vector<int64_t>& shape,
                                   std::vector<std::vector<float>>& xs,
                                   int64_t first, int count,
                                   std::vector<int> ranks = {}) {
    return RoundsWithShapes(
        tensor, std::vector<std::vector<int64_t>>(world_size(), shape), xs,
        first, count, std::move(ranks));
  }
  // The same with a shape per rank.
  std::vector<absl::Status> RoundsWithShapes(
      const std::string& tensor,
      const std::vector<std::vector<int64_t>>& shapes,
      std::vector<std::vector<float>>& xs, int64_t first, int count,
      std::vector<int> ranks = {}) {
    if (ranks.empty()) {
      for (int r = 0; r < world_size(); ++r) ranks.push_back(r);
    }
    std::vector<absl::Status> status(world_size());
    std::vector<std::thread> threads;
    for (int r : ranks) {
      threads.emplace_back([&, r] {
        for (int64_t s = first; s < first + count; ++s) {
          absl::StatusOr<GossipStats> stats =
              nodes_[r]->Round(group_.collective(r), {"job", tensor, s, 0},
                               shapes[r], absl::MakeSpan(xs[r]));
          if (!stats.ok()) {
            status[r] = stats.status();
            return;
          }
          bytes_[r] += stats->bytes_sent;
          for (const EdgeResync& e : stats->resynced) {
            resynced_[r].push_back(e);
          }
        }
      });
    }
    for (auto& t : threads) t.join();
    return status;
  }

  uint64_t bytes_sent(int r) const { return bytes_.at(r); }
  // The edges rank r started again, over every round so far, as
  // "neighbour:this_end/neighbour_end".
  std::vector<std::string> resynced(int r) {
    std::vector<std::string> out;
    for (const EdgeResync& e : resynced_[r]) {
      out.push_back(
          absl::StrCat(e.neighbour, ":", e.this_end, "/", e.neighbour_end));
    }
    return out;
  }

 private:
  InProcessGroup group_;
  std::vector<std::unique_ptr<GossipNode>> nodes_;
  // By rank, sized up front: each rank's thread writes only its own entry
  // (a map's insertions from those threads raced, and crashed a CI run).
  std::vector<uint64_t> bytes_;
  std::vector<std::vector<EdgeResync>> resynced_;
};

// Both ends of every edge of a ring of `w` hold the same factors.
void ExpectEdgesIdentical(Network& net, int w, const std::string& tensor) {
  for (int a = 0; a < w; ++a) {
    const int b = (a + 1) % w;
    absl::StatusOr<EdgeFactors> ab = net.node(a).Factors(tensor, b);
    absl::StatusOr<EdgeFactors> ba = net.node(b).Factors(tensor, a);
    ASSERT_TRUE(ab.ok() && ba.ok()) << ab.status() << ba.status();
    EXPECT_EQ(ab->power_steps, ba->power_steps) << a << "-" << b;
    EXPECT_EQ(ab->p, ba->p) << a << "-" << b;
    EXPECT_EQ(ab->q, ba->q) << a << "-" << b;
  }
}

void ExpectAllOk(const std::vector<absl::Status>& status) {
  for (size_t r = 0; r < status.size(); ++r) {
    EXPECT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
  }
}

std::vector<std::vector<float>> RandomTensors(int w, size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<std::vector<float>> xs(w, std::vector<float>(n));
  for (auto& x : xs) {
    for (float& v : x) v = normal(rng);
  }
  return xs;
}

std::vector<double> Sums(const std::vector<std::vector<float>>& xs) {
  std::vector<double> sum(xs[0].size(), 0.0);
  for (const auto& x : xs) {
    for (size_t i = 0; i < x.size(); ++i) sum[i] += x[i];
  }
  return sum;
}

Topology Make(const std::string& spec, int w) {
  absl::StatusOr<Topology> t = Topology::Parse(spec, w);
  EXPECT_TRUE(t.ok()) << t.status();
  return *t;
}

struct Case {
  std::string topology;
  int world_size;
  Mode mode;
  int rank;
  int iterations;
  std::vector<int64_t> shape;
};

std::string Name(const Case& c) {
  return absl::StrCat(c.topology, " W=", c.world_size, " ",
                      c.mode == Mode::kExact ? "exact" : "powergossip",
                      " r=", c.rank, " it=", c.iterations, " shape ",
                      c.shape.size(), "-D");
}

// The network mean is preserved (each edge's increments are exact
// opposites; only the additions round), and the ranks do move towards it.
TEST(PowerGossipTest, PreservesTheNetworkMeanAndMixes) {
  const std::vector<Case> cases = {
      {"ring", 4, Mode::kPowerGossip, 1, 1, {16, 12}},
      {"ring", 5, Mode::kPowerGossip, 2, 1, {16, 12}},
      {"ring", 8, Mode::kPowerGossip, 1, 2, {9, 4, 3}},
      {"torus", 6, Mode::kPowerGossip, 1, 1, {16, 12}},
      {"torus", 8, Mode::kPowerGossip, 2, 1, {12, 16}},
      {"full", 7, Mode::kPowerGossip, 1, 1, {16, 12}},
      {"ring", 8, Mode::kExact, 1, 1, {16, 12}},
      {"torus", 8, Mode::kPowerGossip, 1, 1, {40}},
      {"edges:0-1,1-2,2-3,3-0,0-2", 4, Mode::kPowerGossip, 1, 1, {8, 8}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(Name(c));
    Network net(Make(c.topology, c.world_size), {c.mode, c.rank, c.iterations});
    size_t n = 1;
    for (int64_t d : c.shape) n *= d;
    std::vector<std::vector<float>> xs =
        RandomTensors(c.world_size, n, /*seed=*/c.world_size * 7 + c.rank);
    const std::vector<double> before = Sums(xs);
    const double distance_before = ConsensusDistance(xs);
    ExpectAllOk(net.Rounds("t", c.shape, xs, 0, 10));
    const std::vector<double> after = Sums(xs);
    double max_error = 0;
    for (size_t i = 0; i < n; ++i) {
      max_error = std::max(max_error, std::fabs(after[i] - before[i]));
    }
    // Values are N(0, 1) and stay near it: 10 rounds x (up to) 2 steps x
    // W ranks of float additions of ulp ~1.2e-7 each bound the drift.
    EXPECT_LT(max_error, 20 * c.world_size * 2.4e-7);
    EXPECT_LT(ConsensusDistance(xs), 0.9 * distance_before);
  }
}

TEST(PowerGossipTest, EqualModelsDoNotChange) {
  for (Mode mode : {Mode::kPowerGossip, Mode::kExact}) {
    Network net(Make("torus", 8), {mode, 2, 2});
    std::vector<std::vector<float>> xs = RandomTensors(1, 96, 3);
    xs.resize(8, xs[0]);
    const std::vector<float> original = xs[0];
    ExpectAllOk(net.Rounds("w", {8, 12}, xs, 0, 5));
    for (int r = 0; r < 8; ++r) {
      EXPECT_EQ(0, std::memcmp(xs[r].data(), original.data(),
                               original.size() * sizeof(float)))
          << "rank " << r;
    }
  }
}

TEST(PowerGossipTest, BothEndsOfEveryEdgeHoldBitIdenticalFactors) {
  for (const char* spec : {"ring", "torus", "full"}) {
    SCOPED_TRACE(spec);
    const Topology topology = Make(spec, 6);
    Network net(topology, {Mode::kPowerGossip, 2, 3});
    std::vector<std::vector<float>> xs = RandomTensors(6, 20 * 7, 11);
    ExpectAllOk(net.Rounds("w", {20, 7}, xs, 0, 4));
    for (int i = 0; i < 6; ++i) {
      for (const Neighbour& n : topology.neighbours(i)) {
        absl::StatusOr<EdgeFactors> mine = net.node(i).Factors("w", n.rank);
        absl::StatusOr<EdgeFactors> theirs = net.node(n.rank).Factors("w", i);
        ASSERT_TRUE(mine.ok()) << mine.status();
        ASSERT_TRUE(theirs.ok()) << theirs.status();
        EXPECT_EQ(mine->power_steps, 12u);
        EXPECT_EQ(mine->power_steps, theirs->power_steps);
        EXPECT_EQ(mine->rank, 2);
        ASSERT_EQ(mine->p.size(), 20u * 2);
        ASSERT_EQ(mine->q.size(), 7u * 2);
        ASSERT_EQ(mine->p.size(), theirs->p.size());
        ASSERT_EQ(mine->q.size(), theirs->q.size());
        EXPECT_EQ(0, std::memcmp(mine->p.data(), theirs->p.data(),
                                 mine->p.size() * sizeof(float)))
            << "edge " << i << "-" << n.rank;
        EXPECT_EQ(0, std::memcmp(mine->q.data(), theirs->q.data(),
                                 mine->q.size() * sizeof(float)))
            << "edge " << i << "-" << n.rank;
      }
    }
    // A tensor with no round yet, and a rank that is no neighbour.
    EXPECT_THAT(net.node(0).Factors("never", 1).status().message(),
                HasSubstr("no gossip state for tensor 'never'"));
    EXPECT_EQ(net.node(0).ChocoCopy("never", 0).status().code(),
              absl::StatusCode::kNotFound);
    EXPECT_EQ(net.node(0).Factors("w", 0).status().code(),
              absl::StatusCode::kNotFound);
  }
}

double SquaredNorm(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(b[i]) - a[i];
    s += d * d;
  }
  return s;
}
double SquaredNorm(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += static_cast<double>(x) * x;
  return s;
}

// Two nodes, D = X_1 - X_0, c = gamma w: a step removes the part of D in
// the input's span, scaled, D' = D - 2c D Q Q^T (or - 2c P P^T D), so by
// Pythagoras ||D'||^2 = ||D||^2 - (1 - (1 - 2c)^2) ||d||^2 with d = D Q the
// factor both ends keep: the predicted rate of every step, for any D.
TEST(PowerGossipTest, TwoNodesContractAtThePredictedRate) {
  for (int rank : {1, 2}) {
    SCOPED_TRACE(absl::StrCat("rank ", rank));
    GossipOptions options{Mode::kPowerGossip, rank, 1};
    Network net(Make("ring", 2), options);
    const double c = options.gamma * 0.5;
    const double removed = 1 - (1 - 2 * c) * (1 - 2 * c);
    std::vector<std::vector<float>> xs = RandomTensors(2, 12 * 10, 5);
    for (int step = 0; step < 20; ++step) {
      const double before = SquaredNorm(xs[0], xs[1]);
      ExpectAllOk(net.Rounds("w", {12, 10}, xs, step, 1));
      absl::StatusOr<EdgeFactors> f = net.node(0).Factors("w", 1);
      ASSERT_TRUE(f.ok()) << f.status();
      // Odd steps keep d in p, even steps in q.
      const double d2 = SquaredNorm(step % 2 == 0 ? f->p : f->q);
      const double after = SquaredNorm(xs[0], xs[1]);
      EXPECT_NEAR(after, before - removed * d2, 1e-5 * before)
          << "step " << step + 1;
      EXPECT_LT(after, before);
    }
  }
}

// A rank-1 difference D = u v^T is in the factors' span from the second
// step on, so each step scales it by exactly |1 - 2 gamma w|.
TEST(PowerGossipTest, TwoNodesRemoveARankOneDifferenceGeometrically) {
  GossipOptions options;  // rank 1, gamma 1.308
  Network net(Make("ring", 2), options);
  const double rate = std::fabs(1 - 2 * options.gamma * 0.5);
  std::vector<std::vector<float>> xs = RandomTensors(2, 16 * 9, 8);
  const std::vector<std::vector<float>> uv = RandomTensors(2, 16, 9);
  for (int i = 0; i < 16; ++i) {
    for (int j = 0; j < 9; ++j)
      xs[1][i * 9 + j] = xs[0][i * 9 + j] + uv[0][i] * uv[1][j];
  }
  ExpectAllOk(net.Rounds("w", {16, 9}, xs, 0, 1));
  for (int step = 1; step < 8; ++step) {
    const double before = std::sqrt(SquaredNorm(xs[0], xs[1]));
    ExpectAllOk(net.Rounds("w", {16, 9}, xs, step, 1));
    const double after = std::sqrt(SquaredNorm(xs[0], xs[1]));
    // fp32 rounding of X (norm ~4 here) floors the difference near 1e-6.
    if (before < 1e-4) break;
    EXPECT_NEAR(after / before, rate, 1e-3) << "step " << step + 1;
  }
}

// Plain gossip on a ring: x_i = cos(2 pi i / W) v is an eigenvector of the
// mixing matrix with eigenvalue 1/3 + 2/3 cos(2 pi / W), so the consensus
// distance shrinks by exactly its square each round.
TEST(PowerGossipTest, PlainGossipOnARingContractsAtItsSpectralRate) {
  constexpr int kW = 8;
  Network net(Make("ring", kW), {Mode::kExact});
  const double lambda = 1.0 / 3 + 2.0 / 3 * std::cos(2 * M_PI / kW);
  const std::vector<float> v = RandomTensors(1, 30, 4)[0];
  std::vector<std::vector<float>> xs(kW, std::vector<float>(30));
  for (int i = 0; i < kW; ++i) {
    for (int k = 0; k < 30; ++k) {
      xs[i][k] = static_cast<float>(std::cos(2 * M_PI * i / kW)) * v[k];
    }
  }
  for (int step = 0; step < 6; ++step) {
    const double before = ConsensusDistance(xs);
    ExpectAllOk(net.Rounds("b", {30}, xs, step, 1));
    EXPECT_NEAR(ConsensusDistance(xs) / before, lambda * lambda, 1e-5);
  }
}

// PowerGossip's diffusion is refused where even two nodes diverge: gamma
// w_ij >= 1 on some edge (a step scales the difference in the factors' span
// by 1 - 2 gamma w_ij). Choco's step and exact gossip's stay in (0, 2].
TEST(PowerGossipTest, ADiffusionAtOrAboveOneOverTheEdgeWeightIsRefused) {
  GossipOptions options;
  options.gamma = 3;
  absl::Status status = ValidateGossipRate(options, Make("ring", 8));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              HasSubstr("PowerGossip diffusion 3 on topology 'ring' (largest "
                        "edge weight 0.333333): expected gamma < 1 / 0.333333 "
                        "= 3; a power step scales an edge's difference"));
  options.gamma = 2.99;
  EXPECT_TRUE(ValidateGossipRate(options, Make("ring", 8)).ok());
  options.gamma = 3.99;  // 2 x 4 torus: 3 neighbours at 1/4
  EXPECT_TRUE(ValidateGossipRate(options, Make("torus", 8)).ok());
  EXPECT_EQ(MaxEdgeWeight(Make("torus", 8)), 0.25);
  options.gamma = 1.5;        // a given weight of 0.8 allows less than 1.25
  options.exact_gamma = 0.5;  // rank 1's edges weigh 1 together
  EXPECT_THAT(
      ValidateGossipRate(options, Make("edges:0-1:0.8,1-2:0.2", 3)).message(),
      HasSubstr("expected gamma < 1 / 0.8 = 1.25"));
  options.gamma = -1;
  EXPECT_THAT(ValidateGossipOptions(options).message(),
              HasSubstr("gossip gamma -1 is not a finite value > 0"));
  options.gamma = 1;
  options.exact_gamma = 2.5;
  EXPECT_THAT(ValidateGossipOptions(options).message(),
              HasSubstr("gossip exact_gamma 2.5 is not in (0, 2]"));
  GossipOptions choco{Mode::kChoco};
  choco.gamma = 2.5;
  EXPECT_THAT(ValidateGossipRate(choco, Make("ring", 8)).message(),
              HasSubstr("gossip gamma 2.5 is not in (0, 2] (Choco-Gossip's"));
  // A round checks it too, on every rank.
  options = GossipOptions{};
  options.gamma = 3;
  Network net(Make("ring", 4), options);
  std::vector<std::vector<float>> xs = RandomTensors(4, 4 * 4, 1);
  for (const absl::Status& s : net.Rounds("w", {4, 4}, xs, 0, 1)) {
    EXPECT_THAT(s.message(), HasSubstr("expected gamma < 1 / 0.333333 = 3"));
  }
}

// Plain gossip's rate: I - W's eigenvalues lie in [0, 2 s], s the largest
// sum of a rank's edge weights, and an even ring reaches 2 s, so exact_gamma
// s >= 1 is refused, for exact gossip and for PowerGossip's 1-D tensors.
TEST(PowerGossipTest, AnExactGossipRateAtOrAboveOneOverTheWeightSumIsRefused) {
  EXPECT_DOUBLE_EQ(MaxNeighbourWeightSum(Make("ring", 8)), 2.0 / 3);
  EXPECT_DOUBLE_EQ(MaxNeighbourWeightSum(Make("torus", 8)), 0.75);
  GossipOptions exact{Mode::kExact};
  exact.exact_gamma = 1.5;
  EXPECT_THAT(ValidateGossipRate(exact, Make("ring", 8)).message(),
              HasSubstr("exact gossip diffusion 1.5 on topology 'ring' "
                        "(largest sum of a rank's edge weights 0.666667): "
                        "expected gamma < 1 / 0.666667 = 1.5"));
  exact.exact_gamma = 1.49;
  EXPECT_TRUE(ValidateGossipRate(exact, Make("ring", 8)).ok());
  EXPECT_FALSE(ValidateGossipRate(exact, Make("torus", 8)).ok());
  GossipOptions power;  // PowerGossip: its 1-D tensors gossip exactly
  power.exact_gamma = 1.4;
  EXPECT_THAT(ValidateGossipRate(power, Make("torus", 8)).message(),
              HasSubstr("exact gossip diffusion (of the 1-D tensors) 1.4"));
  // A ring whose ranks keep no weight of their own: even 1 oscillates.
  power.exact_gamma = 1;
  EXPECT_THAT(ValidateGossipRate(
                  power, Make("edges:0-1:0.5,1-2:0.5,2-3:0.5,0-3:0.5", 4))
                  .message(),
              HasSubstr("expected gamma < 1 / 1 = 1"));
  // Choco's step is not plain gossip's rate.
  GossipOptions choco{Mode::kChoco};
  choco.exact_gamma = 2;
  EXPECT_TRUE(ValidateGossipRate(choco, Make("ring", 8)).ok());
}

// Below 1 / w_max, stability depends on the data. Differences of rank 1,
// x_i = a_i u v^T, fall into every edge's factors' span, and PowerGossip
// then acts as exact gossip on a with rate gamma: with a the ring's
// alternating vector (the eigenvector of I - W's largest eigenvalue, 4/3)
// it diverges above exact gossip's bound 2 / (4/3) = 1.5, though gamma < 3
// passes ValidateGossipRate. Full-rank random differences, spread over
// many directions, still converge at 1.8.
TEST(PowerGossipTest, RankOneDifferencesDivergeAboveExactGossipsBound) {
  constexpr int kW = 8;
  constexpr int kSide = 12;
  const std::vector<std::vector<float>> uv = RandomTensors(2, kSide, 5);
  std::vector<std::vector<float>> rank_one(kW,
                                           std::vector<float>(kSide * kSide));
  for (int i = 0; i < kW; ++i) {
    for (int k = 0; k < kSide * kSide; ++k) {
      rank_one[i][k] =
          (i % 2 == 0 ? 1.0f : -1.0f) * uv[0][k / kSide] * uv[1][k % kSide];
    }
  }
  // The relative distance after `steps` steps.
  auto after = [&](double gamma, std::vector<std::vector<float>> xs, int side,
                   int steps) {
    GossipOptions options;
    options.gamma = gamma;
    Network net(Make("ring", kW), options);
    const double d0 = ConsensusDistance(xs);
    ExpectAllOk(net.Rounds("w", {side, side}, xs, 0, steps));
    return ConsensusDistance(xs) / d0;
  };
  const double stable = after(1.4, rank_one, kSide, 40);
  const double unstable = after(1.6, rank_one, kSide, 40);
  const double random = after(1.8, RandomTensors(kW, 32 * 32, 6), 32, 200);
  EXPECT_LT(stable, 1e-3);
  EXPECT_GT(unstable, 1e3);
  EXPECT_LT(random, 0.05);
}

// Bytes per neighbour and step: one rows x r (or cols x r) factor.
TEST(PowerGossipTest, SendsOneFactorPerNeighbourAndStep) {
  Network net(Make("ring", 4), {Mode::kPowerGossip, 2, 1});
  std::vector<std::vector<float>> xs = RandomTensors(4, 30 * 20, 2);
  ExpectAllOk(net.Rounds("w", {30, 20}, xs, 0, 2));
  // Step 1 sends X q (30 x 2), step 2 X^T p (20 x 2), to 2 neighbours.
  EXPECT_EQ(net.bytes_sent(0), 2 * (32 + 4 * 30 * 2) + 2 * (32 + 4 * 20 * 2));
}

// A daemon restarted without its state: its edges are at power step 0,
// its neighbours' at 3. Both ends of each of its edges see that from the
// other's message and start the edge again together; the round succeeds
// everywhere, keeps the network sum, and the edges agree afterwards.
TEST(PowerGossipTest, AnEdgeOutOfStepStartsAgainAtBothEnds) {
  Network net(Make("ring", 4), {}, absl::Seconds(10));
  std::vector<std::vector<float>> xs = RandomTensors(4, 6 * 5, 6);
  ExpectAllOk(net.Rounds("w", {6, 5}, xs, 0, 3));
  net.ResetNode(2);
  const std::vector<double> before = Sums(xs);
  ExpectAllOk(net.Rounds("w", {6, 5}, xs, 3, 1));
  EXPECT_THAT(net.resynced(1), ::testing::ElementsAre("2:4/1"));
  EXPECT_THAT(net.resynced(3), ::testing::ElementsAre("2:4/1"));
  EXPECT_THAT(net.resynced(2), ::testing::ElementsAre("1:1/4", "3:1/4"));
  EXPECT_THAT(net.resynced(0), ::testing::IsEmpty());
  const std::vector<double> after = Sums(xs);
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_NEAR(after[i], before[i], 1e-5) << i;
  }
  ExpectAllOk(net.Rounds("w", {6, 5}, xs, 4, 3));
  EXPECT_EQ(net.resynced(1).size(), 1u);  // no more
  ExpectEdgesIdentical(net, 4, "w");
}

// A round that fails at one end of an edge and succeeds at the other (rank
// 3 misses step 0: ranks 0 and 2 fail at the deadline, rank 1 gets all its
// messages and advances its edges with them) used to fail those edges in
// every later round, and the failure spread to the whole ring. Now the
// next round starts them again and every rank goes on.
TEST(PowerGossipTest, ARoundThatFailedAtOneEndOnlyIsCaughtUpNextRound) {
  Network net(Make("ring", 4), {}, absl::Seconds(5));
  std::vector<std::vector<float>> xs = RandomTensors(4, 6 * 5, 9);
  std::vector<absl::Status> missing =
      net.Rounds("w", {6, 5}, xs, 0, 1, {0, 1, 2});
  EXPECT_EQ(missing[0].code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(missing[2].code(), absl::StatusCode::kDeadlineExceeded);
  ASSERT_TRUE(missing[1].ok()) << missing[1];

  ExpectAllOk(net.Rounds("w", {6, 5}, xs, 1, 3));
  EXPECT_THAT(net.resynced(1), ::testing::ElementsAre("0:2/1", "2:2/1"));
  EXPECT_THAT(net.resynced(0), ::testing::ElementsAre("1:1/2"));
  EXPECT_THAT(net.resynced(3), ::testing::IsEmpty());
  ExpectEdgesIdentical(net, 4, "w");
}

// Rank 3's tensor has another shape: the transpose (other rows), or as
// many rows and another column count, whose left steps send as many values
// as its neighbours' (both 6 x r). Exact gossip sees the transpose's
// element count alike. Rank 3 and its neighbours fail, naming each other;
// rank 1 mixes as usual.
TEST(PowerGossipTest, ADifferentShapeIsAnErrorNamingTheNeighbour) {
  GossipOptions exact;
  exact.mode = GossipOptions::Mode::kExact;
  for (const auto& [options, odd_shape] :
       std::vector<std::pair<GossipOptions, std::vector<int64_t>>>{
           {{}, {5, 6}}, {{}, {6, 4}}, {exact, {5, 6}}}) {
    Network net(Make("ring", 4), options, absl::Seconds(5));
    std::vector<std::vector<float>> xs = RandomTensors(4, 6 * 5, 6);
    xs[3].resize(odd_shape[0] * odd_shape[1]);
    std::vector<absl::Status> status = net.RoundsWithShapes(
        "w", {{6, 5}, {6, 5}, {6, 5}, odd_shape}, xs, 0, 1);
    const std::string odd = absl::StrCat(odd_shape[0], "x", odd_shape[1]);
    EXPECT_TRUE(status[1].ok()) << odd << ": " << status[1];
    for (const auto& [r, other] : std::vector<std::pair<int, std::string>>{
             {0, "3"}, {2, "3"}, {3, ""}}) {
      EXPECT_EQ(status[r].code(), absl::StatusCode::kInvalidArgument)
          << odd << ": rank " << r << ": " << status[r];
      EXPECT_THAT(status[r].message(),
                  HasSubstr(absl::StrCat(other,
                                         ": neighbour's tensor has "
                                         "another shape")))
          << odd << ": rank " << r;
    }
  }
}

TEST(PowerGossipTest, AMissingNeighbourIsNamedAtTheDeadline) {
  Network net(Make("ring", 4), {}, absl::Seconds(5));
  std::vector<std::vector<float>> xs = RandomTensors(4, 6 * 5, 6);
  std::vector<absl::Status> status =
      net.Rounds("w", {6, 5}, xs, 0, 1, /*ranks=*/{0, 1, 2});
  EXPECT_TRUE(status[1].ok()) << status[1];
  EXPECT_EQ(status[0].code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(status[0].message(), HasSubstr("no message from rank 3"));
  EXPECT_THAT(status[2].message(), HasSubstr("no message from rank 3"));
}

TEST(PowerGossipTest, RefusesACollectiveOfAnotherRankOrSize) {
  GossipNode node(Make("ring", 4), 1, {}, kSeed);
  LocalCollective local;
  std::vector<float> x(30);
  EXPECT_THAT(node.Round(local, {"job", "w", 0, 0}, {6, 5}, absl::MakeSpan(x))
                  .status()
                  .message(),
              HasSubstr("gossip on rank 1 of topology 'ring' over 4 ranks, "
                        "but the collective is rank 0 of 1"));
  GossipNode single(Make("ring", 1), 0, {}, kSeed);
  EXPECT_THAT(single.Round(local, {"job", "w", 0, 0}, {6, 4}, absl::MakeSpan(x))
                  .status()
                  .message(),
              HasSubstr("shape [6,4] has 24 elements but 30 values"));
  // A single rank has nobody to gossip with: nothing changes.
  std::vector<float> y = {1, 2, 3};
  ASSERT_TRUE(
      single.Round(local, {"job", "b", 0, 0}, {3}, absl::MakeSpan(y)).ok());
  EXPECT_EQ(y, (std::vector<float>{1, 2, 3}));
}

// Rounds of `tensor` on every rank of `net_nodes` with each rank's edges in
// its own TensorState (the daemon's path).
std::vector<absl::Status> StateRounds(InProcessGroup& group,
                                      std::vector<GossipNode*> nodes,
                                      std::vector<codecs::TensorState>& states,
                                      const std::vector<int64_t>& shape,
                                      std::vector<std::vector<float>>& xs,
                                      int64_t first, int count) {
  std::vector<absl::Status> status(nodes.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < nodes.size(); ++r) {
    threads.emplace_back([&, r] {
      for (int64_t s = first; s < first + count; ++s) {
        absl::StatusOr<GossipStats> stats =
            nodes[r]->Round(group.collective(r), {"job", "w", s, 0}, shape,
                            absl::MakeSpan(xs[r]), states[r]);
        if (!stats.ok()) {
          status[r] = stats.status();
          return;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  return status;
}

TEST(PowerGossipTest, EdgesKeptInTensorStateGiveTheSameRoundsAndSurviveACopy) {
  GossipOptions options;
  options.rank = 2;
  options.iterations = 2;
  const Topology torus = Make("torus", 6);
  const std::vector<int64_t> shape = {6, 5};
  std::vector<std::vector<float>> in_node = RandomTensors(6, 30, 21);
  std::vector<std::vector<float>> in_state = in_node;
  Network net(torus, options);
  ExpectAllOk(net.Rounds("w", shape, in_node, 0, 5));

  // The first 3 rounds with one set of nodes, the last 2 with fresh nodes
  // that only get the states (as ImportState gives a restarted daemon).
  InProcessGroup group(6, absl::Seconds(60));
  std::vector<std::unique_ptr<GossipNode>> first, second;
  std::vector<GossipNode*> first_ptrs, second_ptrs;
  for (int r = 0; r < 6; ++r) {
    first.push_back(std::make_unique<GossipNode>(torus, r, options, kSeed));
    second.push_back(std::make_unique<GossipNode>(torus, r, options, kSeed));
    first_ptrs.push_back(first.back().get());
    second_ptrs.push_back(second.back().get());
  }
  std::vector<codecs::TensorState> states(6);
  ExpectAllOk(StateRounds(group, first_ptrs, states, shape, in_state, 0, 3));
  std::vector<codecs::TensorState> copies = states;
  ExpectAllOk(StateRounds(group, second_ptrs, copies, shape, in_state, 3, 2));
  for (int r = 0; r < 6; ++r) {
    EXPECT_EQ(0, std::memcmp(in_node[r].data(), in_state[r].data(),
                             30 * sizeof(float)))
        << "rank " << r;
    ASSERT_TRUE(copies[r]
                    .Find("gossip." +
                          std::to_string(torus.neighbours(r)[0].rank) + ".q")
                    .has_value());
  }
}

// Rank 1's round of a 6 x 5 tensor on a ring of 4, from `state`: it fails
// before any exchange when the state does not fit.
absl::Status RoundOnState(const GossipOptions& options,
                          codecs::TensorState& state) {
  GossipNode node(Make("ring", 4), 1, options, kSeed);
  InProcessGroup group(4, absl::Seconds(1));
  std::vector<float> x(30);
  return node
      .Round(group.collective(1), {"job", "w", 0, 0}, {6, 5}, absl::MakeSpan(x),
             state)
      .status();
}

TEST(PowerGossipTest, RefusesTensorStateThatDoesNotFitTheTopology) {
  codecs::TensorState state;
  state.Buffer("gossip.0.meta", 4)[3] = 1;  // rank 2's edge is missing
  const absl::Status got = RoundOnState({}, state);
  EXPECT_EQ(got.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(got.message(),
              HasSubstr("gossip state of tensor 'w' does not fit this round: "
                        "it holds edges for 1 of this rank's 2 neighbours"));
}

// State saved with rank-1 factors and resumed under rank 4: refused, not
// read past the factors' end.
TEST(PowerGossipTest, RefusesTensorStateOfAnotherFactorRank) {
  GossipOptions options;
  options.rank = 4;
  codecs::TensorState state;
  for (int j : {0, 2}) {
    const std::string edge = "gossip." + std::to_string(j) + ".";
    state.Buffer(edge + "meta", 4)[3] = 1;
    state.Buffer(edge + "q", 5);  // cols x 1 for shape [6, 5]
  }
  const absl::Status got = RoundOnState(options, state);
  EXPECT_EQ(got.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(got.message(),
              HasSubstr("holds rank-1 factors, but this job's options give "
                        "rank 4 for shape [6,5]"));
}

// An imported blob's edge scalars and factors are checked before they are
// used: a next step by p without p read through a null buffer (a crash),
// and a cast of NaN or -1 is undefined.
TEST(PowerGossipTest, RefusesEdgeStateThatCannotBeRead) {
  struct Case {
    const char* what;
    std::vector<float> meta;  // step count halves, side, factor rank
    int p_values;             // -1: no p buffer
    const char* error;
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const Case& c : {
           Case{"next step by p, no p", {1, 0, 0, 1}, -1, "(its next step"},
           Case{"next step by p, empty p", {1, 0, 0, 1}, 0, "(its next step"},
           Case{"NaN factor rank", {1, 0, 1, nan}, 6, "factor rank nan"},
           Case{"half a side", {1, 0, 0.5f, 1}, 6, "has side 0.5"},
           Case{"negative steps", {-1, 0, 1, 1}, 6, "halves -1 and 0"},
           Case{"steps past 2^48", {0, 16777216.0f, 1, 1}, 6, "in [0, 2^24)"},
       }) {
    codecs::TensorState state;
    for (int j : {0, 2}) {
      const std::string edge = "gossip." + std::to_string(j) + ".";
      absl::Span<float> meta = state.Buffer(edge + "meta", 4);
      std::copy(c.meta.begin(), c.meta.end(), meta.begin());
      state.Buffer(edge + "q", 5);  // cols x 1 for shape [6, 5]
      if (c.p_values >= 0) state.Buffer(edge + "p", c.p_values);
    }
    const absl::Status got = RoundOnState({}, state);
    EXPECT_EQ(got.code(), absl::StatusCode::kFailedPrecondition) << c.what;
    EXPECT_THAT(got.message(), HasSubstr(c.error)) << c.what;
  }
}

// Ranks 0 and 1 of a ring of 4 hold finite values 4e38 apart, which no
// float difference can hold: in every mode their mix overflows. Both fail
// with an error that says so and keep their state as it was; ranks 2 and
// 3, whose differences with them fit, mix as usual. The next round of
// ordinary values succeeds everywhere (PowerGossip starts the two edges
// that only one end applied again; Choco cannot, docs/gossip.md).
TEST(PowerGossipTest, AMixBeyondFloatRangeFailsAndKeepsTheState) {
  for (const Mode mode : {Mode::kExact, Mode::kPowerGossip, Mode::kChoco}) {
    SCOPED_TRACE(static_cast<int>(mode));
    GossipOptions options;
    options.mode = mode;
    if (mode == Mode::kChoco) {
      options.gamma = 0.5;
      options.choco_fraction = 1;
    }
    const std::vector<int64_t> shape = {4, 1};
    InProcessGroup group(4, absl::Seconds(60));
    std::vector<std::unique_ptr<GossipNode>> owned;
    std::vector<GossipNode*> nodes;
    for (int r = 0; r < 4; ++r) {
      owned.push_back(
          std::make_unique<GossipNode>(Make("ring", 4), r, options, kSeed));
      nodes.push_back(owned.back().get());
    }
    std::vector<codecs::TensorState> states(4);
    std::vector<std::vector<float>> xs = RandomTensors(4, 4, 3);
    ExpectAllOk(StateRounds(group, nodes, states, shape, xs, 0, 2));
    const std::vector<codecs::TensorState> before = states;

    std::vector<std::vector<float>> huge = RandomTensors(4, 4, 4);
    huge[0].assign(4, 2e38f);
    huge[1].assign(4, -2e38f);
    const std::vector<absl::Status> status =
        StateRounds(group, nodes, states, shape, huge, 2, 1);
    for (int r : {0, 1}) {
      EXPECT_EQ(status[r].code(), absl::StatusCode::kInvalidArgument)
          << "rank " << r << ": " << status[r];
      EXPECT_THAT(status[r].message(),
                  HasSubstr("gossip of tensor 'w' step 2: mixing with the "
                            "neighbours overflowed float range in 4 values "
                            "(first at index 0: "));
      EXPECT_EQ(states[r].buffers(), before[r].buffers()) << "rank " << r;
    }
    for (int r : {2, 3}) {
      EXPECT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
      for (float v : huge[r]) EXPECT_TRUE(std::isfinite(v)) << "rank " << r;
    }
    if (mode == Mode::kChoco) continue;
    ExpectAllOk(StateRounds(group, nodes, states, shape, xs, 3, 1));
  }
}

}  // namespace
}  // namespace gradcomp::service
