// Gossip mode through eight real gradcompd processes on loopback, one
// client per daemon (docs/gossip.md): ring and torus, exact gossip,
// PowerGossip and Choco-Gossip, random vectors and matrices (fixed seeds). The
// network mean is preserved, equal inputs come back unchanged, plain gossip's
// consensus distance shrinks at the mixing matrix's rate, identical seeds give
// identical results, and ranks that name different topologies are refused
// with an error naming both.
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cpp/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster.h"
#include "tests/integration/daemon_process.h"

namespace gradcomp::testing {
namespace {

using ::testing::HasSubstr;

constexpr int kWorld = 8;

using Tensors = std::vector<std::vector<float>>;

Tensors RandomTensors(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal;
  Tensors xs(kWorld, std::vector<float>(n));
  for (auto& x : xs) {
    for (float& v : x) v = normal(gen);
  }
  return xs;
}

std::vector<double> Mean(const Tensors& xs) {
  std::vector<double> mean(xs[0].size(), 0.0);
  for (const auto& x : xs) {
    for (size_t i = 0; i < x.size(); ++i) mean[i] += x[i];
  }
  for (double& m : mean) m /= kWorld;
  return mean;
}

// sum_i ||x_i - mean||^2 / W.
double Distance(const Tensors& xs) {
  const std::vector<double> mean = Mean(xs);
  double sum = 0;
  for (const auto& x : xs) {
    for (size_t i = 0; i < x.size(); ++i) {
      sum += (x[i] - mean[i]) * (x[i] - mean[i]);
    }
  }
  return sum / kWorld;
}

v1::GossipSpec Spec(const std::string& topology, uint32_t rank = 0,
                    uint32_t power_steps = 0, double diffusion = 0) {
  v1::GossipSpec spec;
  spec.set_topology(topology);
  spec.set_rank(rank);
  spec.set_power_steps(power_steps);
  spec.set_diffusion(diffusion);
  return spec;
}

class GossipTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    cluster_ = new Cluster(kWorld, absl::Seconds(30));
    const absl::Status up = cluster_->StartAll();
    ASSERT_TRUE(up.ok()) << up;
    for (int r = 0; r < kWorld; ++r) {
      auto client = cluster_->daemon(r).Connect();
      ASSERT_TRUE(client.ok()) << client.status();
      clients_[r] = std::move(*client).release();
    }
  }
  static void TearDownTestSuite() {
    for (client::Client*& c : clients_) {
      delete c;
      c = nullptr;
    }
    delete cluster_;
    cluster_ = nullptr;
  }

  // Gossip rounds [first, first + rounds) of `tensor` on every rank, one
  // thread per rank, in place; `distances` gets the consensus distance
  // after each round. Statuses by rank (the first failure of each).
  static std::vector<absl::Status> Rounds(
      const std::string& job, const std::string& tensor,
      const std::vector<int64_t>& shape, Tensors& xs,
      const std::vector<v1::GossipSpec>& specs, int64_t first, int rounds,
      std::vector<double>* distances = nullptr) {
    std::vector<absl::Status> status(kWorld);
    for (int64_t s = first; s < first + rounds; ++s) {
      std::vector<std::thread> threads;
      for (int r = 0; r < kWorld; ++r) {
        threads.emplace_back([&, r] {
          if (!status[r].ok()) return;
          auto out = clients_[r]->Gossip(job, tensor, s, xs[r], shape, specs[r],
                                         /*consensus_distance=*/0);
          if (!out.ok()) {
            status[r] = out.status();
            return;
          }
          xs[r] = std::move(out->values);
        });
      }
      for (std::thread& t : threads) t.join();
      if (distances != nullptr) distances->push_back(Distance(xs));
    }
    return status;
  }

  static std::vector<absl::Status> Rounds(
      const std::string& job, const std::string& tensor,
      const std::vector<int64_t>& shape, Tensors& xs,
      const v1::GossipSpec& spec, int64_t first, int rounds,
      std::vector<double>* distances = nullptr) {
    return Rounds(job, tensor, shape, xs,
                  std::vector<v1::GossipSpec>(kWorld, spec), first, rounds,
                  distances);
  }

  static Cluster* cluster_;
  static client::Client* clients_[kWorld];
};

Cluster* GossipTest::cluster_ = nullptr;
client::Client* GossipTest::clients_[kWorld] = {};

void ExpectAllOk(const std::vector<absl::Status>& status) {
  for (size_t r = 0; r < status.size(); ++r) {
    EXPECT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
  }
}

void ExpectMeanPreserved(const std::vector<double>& before,
                         const Tensors& after) {
  const std::vector<double> now = Mean(after);
  for (size_t i = 0; i < before.size(); ++i) {
    ASSERT_NEAR(now[i], before[i], 1e-5) << "element " << i;
  }
}

// Plain gossip on a ring of 8 (weights 1/3) shrinks the consensus distance
// by at most lambda^2 per round, lambda = 1/3 + 2/3 cos(2 pi / 8) the
// mixing matrix's second eigenvalue, and by lambda^2 itself once the other
// eigenvectors' parts have died out.
TEST_F(GossipTest, ExactGossipOnARingContractsAtTheSpectralRate) {
  const double lambda = 1.0 / 3 + 2.0 / 3 * std::cos(2 * M_PI / kWorld);
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{1000}, std::vector<int64_t>{32, 24}}) {
    const std::string tensor = shape.size() == 1 ? "vector" : "matrix";
    Tensors xs = RandomTensors(shape.size() == 1 ? 1000 : 32 * 24, 1);
    const std::vector<double> mean = Mean(xs);
    std::vector<double> d = {Distance(xs)};
    ExpectAllOk(
        Rounds("exact-ring", tensor, shape, xs, Spec("ring"), 0, 25, &d));
    ExpectMeanPreserved(mean, xs);
    for (size_t k = 1; k < d.size(); ++k) {
      EXPECT_LE(d[k], d[k - 1] * lambda * lambda * (1 + 1e-4))
          << tensor << " round " << k;
    }
    EXPECT_NEAR(d.back() / d[d.size() - 2], lambda * lambda, 1e-3) << tensor;
  }
}

// One round of exact gossip on the ring is the ring's Metropolis-Hastings
// mixing, element by element: (x_{i-1} + x_i + x_{i+1}) / 3.
TEST_F(GossipTest, ExactGossipOnARingMixesWithBothNeighboursAtOneThird) {
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{50}, std::vector<int64_t>{6, 5}}) {
    const std::string tensor = shape.size() == 1 ? "vector" : "matrix";
    const Tensors xs = RandomTensors(shape.size() == 1 ? 50 : 30, 7);
    Tensors mixed = xs;
    ExpectAllOk(Rounds("one-third", tensor, shape, mixed, Spec("ring"), 0, 1));
    for (int r = 0; r < kWorld; ++r) {
      const auto& left = xs[(r + kWorld - 1) % kWorld];
      const auto& right = xs[(r + 1) % kWorld];
      for (size_t i = 0; i < xs[r].size(); ++i) {
        const double expected = (double{left[i]} + xs[r][i] + right[i]) / 3;
        ASSERT_NEAR(mixed[r][i], expected, 1e-5)
            << tensor << " rank " << r << " element " << i;
      }
    }
  }
}

// A topology the daemon does not know comes back through the client as
// InvalidArgument, naming it and the topologies it expected.
TEST_F(GossipTest, AnUnknownTopologyIsRefusedNamingTheExpectedOnes) {
  Tensors xs = RandomTensors(8, 8);
  const std::vector<absl::Status> status =
      Rounds("unknown", "vector", {8}, xs, Spec("hexagon"), 0, 1);
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(status[r].code(), absl::StatusCode::kInvalidArgument)
        << "rank " << r << ": " << status[r];
    EXPECT_THAT(status[r].message(),
                HasSubstr("unknown topology 'hexagon'; expected ring"));
  }
}

TEST_F(GossipTest, PowerGossipOnRingAndTorusKeepsTheMeanAndMixes) {
  for (const std::string topology : {"ring", "torus"}) {
    for (uint32_t rank : {1u, 2u}) {
      const std::string job = absl::StrCat("power-", topology, "-", rank);
      Tensors xs = RandomTensors(32 * 24, 2);
      const std::vector<double> mean = Mean(xs);
      const double start = Distance(xs);
      ExpectAllOk(Rounds(job, "matrix", {32, 24}, xs,
                         Spec(topology, rank, 2, 1.308), 0, 10));
      ExpectMeanPreserved(mean, xs);
      EXPECT_LT(Distance(xs), 0.9 * start) << job;
      // Vectors gossip plainly in the same job.
      Tensors vs = RandomTensors(100, 3);
      const std::vector<double> vmean = Mean(vs);
      ExpectAllOk(
          Rounds(job, "bias", {100}, vs, Spec(topology, rank, 2, 1.308), 0, 3));
      ExpectMeanPreserved(vmean, vs);
    }
  }
  auto page = HttpGet(cluster_->daemon(0).metrics_port(), "/metrics");
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_GT(Sample(*page, "gradcomp_gossip_bytes_total{peer=\"1\"}"), 0);
}

// Choco-Gossip with 5 % top-k (39 of 768 entries per neighbour and round)
// through the daemons: the mean is kept and the distance falls (to about
// 0.07x on the ring in 30 rounds at step size 0.2).
TEST_F(GossipTest, ChocoGossipOnRingAndTorusKeepsTheMeanAndMixes) {
  for (const std::string topology : {"ring", "torus"}) {
    const std::string job = absl::StrCat("choco-", topology);
    v1::GossipSpec spec = Spec(topology, 0, 1, 0.2);
    spec.set_choco_topk_fraction(0.05);
    Tensors xs = RandomTensors(32 * 24, 2);
    const std::vector<double> mean = Mean(xs);
    const double start = Distance(xs);
    ExpectAllOk(Rounds(job, "matrix", {32, 24}, xs, spec, 0, 30));
    ExpectMeanPreserved(mean, xs);
    EXPECT_LT(Distance(xs), 0.25 * start) << job;
  }
}

TEST_F(GossipTest, EqualInputsComeBackUnchanged) {
  const std::vector<float> same = RandomTensors(16 * 12, 4)[0];
  Tensors xs(kWorld, same);
  ExpectAllOk(Rounds("equal", "matrix", {16, 12}, xs,
                     Spec("torus", 2, 2, 1.308), 0, 3));
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(xs[r], same) << "rank " << r;
}

TEST_F(GossipTest, IdenticalSeedsGiveIdenticalResults) {
  Tensors a = RandomTensors(20 * 10, 5), b = a;
  ExpectAllOk(Rounds("seed-a", "matrix", {20, 10}, a,
                     Spec("torus", 1, 1, 1.308), 0, 4));
  ExpectAllOk(Rounds("seed-b", "matrix", {20, 10}, b,
                     Spec("torus", 1, 1, 1.308), 0, 4));
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(0, std::memcmp(a[r].data(), b[r].data(), a[r].size() * 4))
        << "rank " << r;
  }
}

TEST_F(GossipTest, RanksThatNameDifferentTopologiesAreRefused) {
  std::vector<v1::GossipSpec> specs(kWorld, Spec("ring", 1));
  specs[7] = Spec("torus", 1);
  Tensors xs = RandomTensors(8 * 4, 6);
  const std::vector<absl::Status> status =
      Rounds("mismatch", "matrix", {8, 4}, xs, specs, 0, 1);
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(status[r].code(), absl::StatusCode::kInvalidArgument)
        << "rank " << r << ": " << status[r];
    EXPECT_THAT(status[r].message(),
                HasSubstr("ranks disagree on the gossip spec"));
  }
  EXPECT_THAT(status[0].message(),
              HasSubstr("rank 0 has topology 'ring', rank 1, 1 power step(s), "
                        "diffusion 1, rank 7 has topology 'torus'"));
  EXPECT_THAT(status[7].message(),
              HasSubstr("rank 7 has topology 'torus', rank 1, 1 power "
                        "step(s), diffusion 1, rank 0 has topology 'ring'"));
}

}  // namespace
}  // namespace gradcomp::testing
