// Choco-Gossip's top-k step (choco_gossip.h) and GossipNode's Mode::kChoco
// (power_gossip.h): W ranks as threads over the in-process neighbour
// exchange (the real PeerCollective messages), fixed seeds.
#include "service/gossip/choco_gossip.h"

#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/collective/in_process_group.h"
#include "service/gossip/power_gossip.h"
#include "service/gossip/topology.h"

namespace gradcomp::service {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

GossipOptions Choco(double fraction, double gamma) {
  GossipOptions options;
  options.mode = GossipOptions::Mode::kChoco;
  options.choco_fraction = fraction;
  options.gamma = gamma;
  return options;
}

Topology Make(const std::string& spec, int w) {
  absl::StatusOr<Topology> t = Topology::Parse(spec, w);
  EXPECT_TRUE(t.ok()) << t.status();
  return *t;
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

// W Choco nodes over one in-process group, each rank's rounds on its own
// thread; the rounds keep their state in the nodes, or in one TensorState
// per rank (the daemon's path) when `states` is given.
class Network {
 public:
  Network(const Topology& topology, GossipOptions options,
          absl::Duration timeout = absl::Seconds(60))
      : group_(topology.world_size(), timeout) {
    for (int r = 0; r < topology.world_size(); ++r) {
      nodes_.push_back(std::make_unique<GossipNode>(topology, r, options, 7));
    }
  }
  GossipNode& node(int r) { return *nodes_[r]; }

  // Rounds [first, first + count); the first error, or OK. Bytes each rank
  // sent are added to bytes_sent.
  absl::Status Rounds(const std::vector<int64_t>& shape,
                      std::vector<std::vector<float>>& xs, int64_t first,
                      int count,
                      std::vector<codecs::TensorState>* states = nullptr) {
    const int w = static_cast<int>(nodes_.size());
    std::vector<absl::Status> status(w);
    bytes_sent.resize(w, 0);
    std::vector<std::thread> threads;
    for (int r = 0; r < w; ++r) {
      threads.emplace_back([&, r] {
        for (int64_t s = first; s < first + count; ++s) {
          const RoundKey key{"job", "x", s, 0};
          absl::StatusOr<GossipStats> stats =
              states == nullptr
                  ? nodes_[r]->Round(group_.collective(r), key, shape,
                                     absl::MakeSpan(xs[r]))
                  : nodes_[r]->Round(group_.collective(r), key, shape,
                                     absl::MakeSpan(xs[r]), (*states)[r]);
          if (!stats.ok()) {
            status[r] = stats.status();
            return;
          }
          bytes_sent[r] += stats->bytes_sent;
        }
      });
    }
    for (auto& t : threads) t.join();
    for (const absl::Status& s : status) {
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

  std::vector<uint64_t> bytes_sent;

 private:
  InProcessGroup group_;
  std::vector<std::unique_ptr<GossipNode>> nodes_;
};

double Distance(const std::vector<std::vector<float>>& xs) {
  return ConsensusDistance(xs);
}

TEST(ChocoKTest, RoundsUpAndKeepsAFractionGivenAsKOverN) {
  EXPECT_EQ(ChocoK(0.01, 1000), 10);
  EXPECT_EQ(ChocoK(0.0101, 1000), 11);
  EXPECT_EQ(ChocoK(28.0 / 3136, 3136), 28);
  EXPECT_EQ(ChocoK(50.0 / 10000, 10000), 50);
  EXPECT_EQ(ChocoK(1e-9, 100), 1);
  EXPECT_EQ(ChocoK(1.0, 100), 100);
  EXPECT_EQ(ChocoK(0.5, 0), 0);
}

TEST(ChocoKTest, RefusesFractionsOutsideZeroToOne) {
  for (double f : {0.0, -0.1, 1.5, std::nan("")}) {
    absl::Status s = ValidateChocoFraction(f);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << f;
    EXPECT_THAT(s.message(), HasSubstr("is not in (0, 1]"));
  }
  GossipOptions options = Choco(0, 0.5);
  EXPECT_FALSE(ValidateGossipOptions(options).ok());
  EXPECT_TRUE(ValidateGossipOptions(Choco(0.25, 0.5)).ok());
}

TEST(TopKIndicesTest, LargestMagnitudesAscendingTiesToTheLowerIndex) {
  std::vector<uint32_t> idx;
  TopKIndices({0.5f, -3.0f, 2.0f, -2.0f, 2.0f, 0.0f}, 3, &idx);
  EXPECT_THAT(idx, ElementsAre(1, 2, 3));
  TopKIndices({1.0f, 1.0f, 1.0f, 1.0f}, 2, &idx);
  EXPECT_THAT(idx, ElementsAre(0, 1));
  TopKIndices({1.0f, std::nanf(""), -5.0f}, 1, &idx);
  EXPECT_THAT(idx, ElementsAre(1));
  TopKIndices({1.0f, 2.0f}, 2, &idx);
  EXPECT_THAT(idx, ElementsAre(0, 1));
  TopKIndices({1.0f, 2.0f}, 0, &idx);
  EXPECT_TRUE(idx.empty());
}

// Choco written out directly, all ranks in one thread: x_hat_i is the same
// at i and at its neighbours, so one copy per rank.
void ReferenceRound(const Topology& topology, double fraction, double gamma,
                    std::vector<std::vector<float>>& xs,
                    std::vector<std::vector<float>>& hat) {
  const int w = topology.world_size();
  const size_t n = xs[0].size();
  const size_t k = static_cast<size_t>(ChocoK(fraction, n));
  for (int i = 0; i < w; ++i) {
    std::vector<std::pair<float, size_t>> order;
    for (size_t e = 0; e < n; ++e) {
      order.push_back({-std::fabs(xs[i][e] - hat[i][e]), e});
    }
    std::sort(order.begin(), order.end());
    for (size_t e = 0; e < k; ++e) {
      const size_t at = order[e].second;
      hat[i][at] += xs[i][at] - hat[i][at];
    }
  }
  for (int i = 0; i < w; ++i) {
    for (size_t e = 0; e < n; ++e) {
      double mix = 0;
      for (const Neighbour& nb : topology.neighbours(i)) {
        mix += nb.weight * (hat[nb.rank][e] - hat[i][e]);
      }
      xs[i][e] += static_cast<float>(gamma * mix);
    }
  }
}

TEST(ChocoGossipTest, MatchesAStraightforwardReference) {
  const Topology ring = Make("ring", 6);
  std::vector<std::vector<float>> xs = RandomTensors(6, 200, 3);
  std::vector<std::vector<float>> want = xs;
  std::vector<std::vector<float>> hat(6, std::vector<float>(200, 0.0f));
  Network net(ring, Choco(0.05, 0.4));
  ASSERT_TRUE(net.Rounds({10, 20}, xs, 0, 15).ok());
  for (int s = 0; s < 15; ++s) ReferenceRound(ring, 0.05, 0.4, want, hat);
  for (int r = 0; r < 6; ++r) {
    for (size_t e = 0; e < 200; ++e) {
      ASSERT_NEAR(xs[r][e], want[r][e], 1e-5) << "rank " << r << " " << e;
    }
    absl::StatusOr<std::vector<float>> own = net.node(r).ChocoCopy("x", r);
    ASSERT_TRUE(own.ok()) << own.status();
    for (size_t e = 0; e < 200; ++e) ASSERT_NEAR((*own)[e], hat[r][e], 1e-5);
  }
}

TEST(ChocoGossipTest, KeepsTheMeanAndCopiesAgreeBitForBit) {
  for (const char* spec : {"ring", "torus"}) {
    for (std::vector<int64_t> shape :
         {std::vector<int64_t>{16, 12}, std::vector<int64_t>{192}}) {
      SCOPED_TRACE(spec);
      const Topology topology = Make(spec, 8);
      std::vector<std::vector<float>> xs = RandomTensors(8, 192, 5);
      std::vector<double> start(192, 0.0);
      for (const auto& x : xs) {
        for (size_t e = 0; e < 192; ++e) start[e] += x[e];
      }
      const double d0 = Distance(xs);
      Network net(topology, Choco(0.1, 0.3));
      ASSERT_TRUE(net.Rounds(shape, xs, 0, 30).ok());
      for (size_t e = 0; e < 192; ++e) {
        double sum = 0, magnitude = 0;
        for (const auto& x : xs) {
          sum += x[e];
          magnitude += std::fabs(x[e]);
        }
        // 30 rounds of additions of terms no larger than the values.
        EXPECT_NEAR(sum, start[e], 30 * 8 * 6e-8 * (magnitude + 8)) << e;
      }
      EXPECT_LT(Distance(xs), 0.5 * d0);
      for (int i = 0; i < 8; ++i) {
        absl::StatusOr<std::vector<float>> at_i = net.node(i).ChocoCopy("x", i);
        ASSERT_TRUE(at_i.ok());
        for (const Neighbour& n : topology.neighbours(i)) {
          absl::StatusOr<std::vector<float>> at_j =
              net.node(n.rank).ChocoCopy("x", i);
          ASSERT_TRUE(at_j.ok()) << at_j.status();
          ASSERT_EQ(0, std::memcmp(at_i->data(), at_j->data(),
                                   at_i->size() * sizeof(float)))
              << "x_hat_" << i << " at " << i << " and at " << n.rank;
        }
      }
    }
  }
}

TEST(ChocoGossipTest, EqualModelsDoNotChange) {
  std::vector<std::vector<float>> xs(8, RandomTensors(1, 150, 9)[0]);
  const std::vector<std::vector<float>> start = xs;
  Network net(Make("torus", 8), Choco(0.2, 1.0));
  ASSERT_TRUE(net.Rounds({10, 15}, xs, 0, 8).ok());
  for (int r = 0; r < 8; ++r) {
    ASSERT_EQ(0, std::memcmp(xs[r].data(), start[r].data(), 150 * 4)) << r;
  }
}

TEST(ChocoGossipTest, ConvergesOnARingAndSendsKEntriesPerNeighbour) {
  const Topology ring = Make("ring", 8);
  std::vector<std::vector<float>> xs = RandomTensors(8, 400, 11);
  const double d0 = Distance(xs);
  // gamma 0.1 is stable for 5 % top-k on this ring (0.3 diverges).
  Network net(ring, Choco(0.05, 0.1));
  ASSERT_TRUE(net.Rounds({20, 20}, xs, 0, 400).ok());
  EXPECT_LT(Distance(xs), 1e-6 * d0);
  // k = 20 of 400: a 32-byte header and 20 (index, value) pairs, to each
  // of 2 neighbours, 400 rounds.
  for (uint64_t b : net.bytes_sent) EXPECT_EQ(b, 400u * 2 * (32 + 8 * 20));
}

TEST(ChocoGossipTest, StateInATensorStateGivesTheSameRounds) {
  const Topology torus = Make("torus", 8);
  std::vector<std::vector<float>> a = RandomTensors(8, 96, 13);
  std::vector<std::vector<float>> b = a;
  Network in_nodes(torus, Choco(0.1, 0.5));
  Network in_states(torus, Choco(0.1, 0.5));
  std::vector<codecs::TensorState> states(8);
  ASSERT_TRUE(in_nodes.Rounds({8, 12}, a, 0, 6).ok());
  ASSERT_TRUE(in_states.Rounds({8, 12}, b, 0, 3, &states).ok());
  // The daemon's export and import: a copy of the state in fresh nodes.
  std::vector<codecs::TensorState> copies = states;
  Network restarted(torus, Choco(0.1, 0.5));
  ASSERT_TRUE(restarted.Rounds({8, 12}, b, 3, 3, &copies).ok());
  for (int r = 0; r < 8; ++r) {
    ASSERT_EQ(0, std::memcmp(a[r].data(), b[r].data(), 96 * 4)) << r;
    EXPECT_TRUE(copies[r].Find("gossip.self.hat").has_value());
    EXPECT_TRUE(copies[r].Find("gossip.choco").has_value());
  }
}

TEST(ChocoGossipTest, RefusesStateOfAnotherSizeAndANeighbourOutOfStep) {
  const Topology ring = Make("ring", 4);
  std::vector<std::vector<float>> xs = RandomTensors(4, 40, 17);
  std::vector<codecs::TensorState> states(4);
  Network net(ring, Choco(0.1, 0.5));
  ASSERT_TRUE(net.Rounds({40}, xs, 0, 2, &states).ok());
  std::vector<codecs::TensorState> wrong = states;
  wrong[0].Buffer("gossip.self.hat", 41);
  // Rank 0 fails before its exchange: its neighbours meet the deadline.
  Network again(ring, Choco(0.1, 0.5), absl::Seconds(1));
  absl::Status s = again.Rounds({40}, xs, 2, 1, &wrong);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("'gossip.self.hat' has 41 values"));

  // Rank 0 lost its state (a restart without import): its neighbours name
  // the step counts.
  std::vector<codecs::TensorState> lost = states;
  lost[0].Clear();
  Network restarted(ring, Choco(0.1, 0.5), absl::Seconds(5));
  s = restarted.Rounds({40}, xs, 2, 1, &lost);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("power step"));
}

// A step count no save wrote (a corrupt or edited import): refused, not
// cast (undefined for NaN).
TEST(ChocoGossipTest, RefusesAStepCountThatIsNotAWholeNumber) {
  const Topology ring = Make("ring", 4);
  std::vector<std::vector<float>> xs = RandomTensors(4, 40, 17);
  std::vector<codecs::TensorState> states(4);
  Network net(ring, Choco(0.1, 0.5));
  ASSERT_TRUE(net.Rounds({40}, xs, 0, 2, &states).ok());
  states[0].Buffer("gossip.choco", 2)[0] =
      std::numeric_limits<float>::quiet_NaN();
  Network imported(ring, Choco(0.1, 0.5), absl::Seconds(1));
  const absl::Status s = imported.Rounds({40}, xs, 2, 1, &states);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(),
              HasSubstr("its Choco state has step count halves nan and 0"));
}

}  // namespace
}  // namespace gradcomp::service
