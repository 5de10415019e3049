#include "service/gossip/topology.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradcomp::service {
namespace {

using ::testing::HasSubstr;

std::vector<int> Ranks(const Topology& t, int rank) {
  std::vector<int> out;
  for (const Neighbour& n : t.neighbours(rank)) out.push_back(n.rank);
  return out;
}

TEST(TopologyTest, RingHasTwoNeighboursAtOneThird) {
  absl::StatusOr<Topology> ring = Topology::Ring(8);
  ASSERT_TRUE(ring.ok()) << ring.status();
  EXPECT_EQ(Ranks(*ring, 0), (std::vector<int>{1, 7}));
  EXPECT_EQ(Ranks(*ring, 5), (std::vector<int>{4, 6}));
  for (int i = 0; i < 8; ++i) {
    for (const Neighbour& n : ring->neighbours(i)) {
      EXPECT_DOUBLE_EQ(n.weight, 1.0 / 3);
    }
    EXPECT_NEAR(ring->self_weight(i), 1.0 / 3, 1e-15);
  }
  EXPECT_TRUE(ValidateMixingMatrix(ring->MixingMatrix(), 8).ok());
}

TEST(TopologyTest, SmallRingsAndSingleRank) {
  absl::StatusOr<Topology> two = Topology::Ring(2);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(Ranks(*two, 0), (std::vector<int>{1}));
  EXPECT_DOUBLE_EQ(two->neighbours(0)[0].weight, 0.5);
  absl::StatusOr<Topology> one = Topology::Ring(1);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_TRUE(one->neighbours(0).empty());
  EXPECT_DOUBLE_EQ(one->self_weight(0), 1.0);
}

TEST(TopologyTest, TorusHasFourNeighboursAtOneFifth) {
  absl::StatusOr<Topology> torus = Topology::Torus(3, 4);
  ASSERT_TRUE(torus.ok()) << torus.status();
  EXPECT_EQ(torus->world_size(), 12);
  // Rank 5 is (1, 1): up (0, 1) = 1, down (2, 1) = 9, left 4, right 6.
  EXPECT_EQ(Ranks(*torus, 5), (std::vector<int>{1, 4, 6, 9}));
  // Rank 0 wraps: (2, 0) = 8 and (0, 3) = 3.
  EXPECT_EQ(Ranks(*torus, 0), (std::vector<int>{1, 3, 4, 8}));
  for (const Neighbour& n : torus->neighbours(5)) {
    EXPECT_DOUBLE_EQ(n.weight, 0.2);
  }
  EXPECT_TRUE(ValidateMixingMatrix(torus->MixingMatrix(), 12).ok());
}

TEST(TopologyTest, TorusWithASideOfTwoHasThreeNeighbours) {
  absl::StatusOr<Topology> torus = Topology::Torus(2, 4);
  ASSERT_TRUE(torus.ok()) << torus.status();
  // (0, 0): (1, 0) = 4 both ways up and down, 1 and 3 left and right.
  EXPECT_EQ(Ranks(*torus, 0), (std::vector<int>{1, 3, 4}));
  EXPECT_DOUBLE_EQ(torus->neighbours(0)[0].weight, 0.25);
}

TEST(TopologyTest, FullIsUniform) {
  absl::StatusOr<Topology> full = Topology::Full(5);
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_EQ(Ranks(*full, 2), (std::vector<int>{0, 1, 3, 4}));
  for (double w : full->MixingMatrix()) EXPECT_DOUBLE_EQ(w, 0.2);
}

TEST(TopologyTest, EdgeListFillsMetropolisHastingsWeights) {
  // A star: the centre has degree 3, the leaves 1, so each edge weighs
  // 1 / (1 + 3) and the leaves keep 3/4.
  absl::StatusOr<Topology> star =
      Topology::FromEdges(4, {{0, 1, {}}, {0, 2, {}}, {3, 0, {}}});
  ASSERT_TRUE(star.ok()) << star.status();
  EXPECT_EQ(Ranks(*star, 0), (std::vector<int>{1, 2, 3}));
  EXPECT_DOUBLE_EQ(star->neighbours(3)[0].weight, 0.25);
  EXPECT_DOUBLE_EQ(star->self_weight(0), 0.25);
  EXPECT_DOUBLE_EQ(star->self_weight(1), 0.75);
  EXPECT_TRUE(ValidateMixingMatrix(star->MixingMatrix(), 4).ok());
}

TEST(TopologyTest, EdgeListKeepsGivenWeights) {
  absl::StatusOr<Topology> path =
      Topology::FromEdges(3, {{0, 1, 0.5}, {1, 2, 0.25}});
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_DOUBLE_EQ(path->neighbours(1)[0].weight, 0.5);
  EXPECT_DOUBLE_EQ(path->neighbours(1)[1].weight, 0.25);
  EXPECT_DOUBLE_EQ(path->self_weight(1), 0.25);
}

TEST(TopologyTest, EdgeListErrorsSayWhatWasExpected) {
  EXPECT_THAT(
      Topology::FromEdges(4, {{0, 1, {}}, {2, 3, {}}}).status().message(),
      HasSubstr("not connected: rank 0 cannot reach rank(s) 2, 3"));
  EXPECT_THAT(Topology::FromEdges(3, {{0, 1, {}}, {1, 0, {}}, {1, 2, {}}})
                  .status()
                  .message(),
              HasSubstr("edge 0-1 is listed twice"));
  EXPECT_THAT(Topology::FromEdges(3, {{1, 1, {}}}).status().message(),
              HasSubstr("joins a rank to itself"));
  EXPECT_THAT(Topology::FromEdges(3, {{0, 3, {}}}).status().message(),
              HasSubstr("expected ranks in [0, 3)"));
  EXPECT_THAT(Topology::FromEdges(3, {{0, 1, -0.5}}).status().message(),
              HasSubstr("weight -0.5 is not in (0, 1]"));
  // Rank 0's edges weigh 1.4 together: its self weight would be -0.4.
  EXPECT_THAT(
      Topology::FromEdges(3, {{0, 1, 0.7}, {0, 2, 0.7}}).status().message(),
      HasSubstr("expected non-negative weights"));
}

TEST(TopologyTest, ParseNamesEveryKind) {
  absl::StatusOr<Topology> torus = Topology::Parse("torus", 8);
  ASSERT_TRUE(torus.ok()) << torus.status();
  EXPECT_EQ(torus->name(), "torus:2x4");
  absl::StatusOr<Topology> square = Topology::Parse("torus:3x3", 9);
  ASSERT_TRUE(square.ok()) << square.status();
  EXPECT_EQ(square->neighbours(4).size(), 4u);
  absl::StatusOr<Topology> edges = Topology::Parse("edges:0-1,1-2:0.25", 3);
  ASSERT_TRUE(edges.ok()) << edges.status();
  EXPECT_DOUBLE_EQ(edges->neighbours(2)[0].weight, 0.25);
  EXPECT_DOUBLE_EQ(edges->neighbours(0)[0].weight, 1.0 / 3);
  EXPECT_TRUE(Topology::Parse("ring", 6).ok());
  EXPECT_TRUE(Topology::Parse("full", 6).ok());

  EXPECT_THAT(Topology::Parse("torus:2x3", 8).status().message(),
              HasSubstr("has 6 ranks but the world size is 8"));
  EXPECT_THAT(Topology::Parse("torus:2by4", 8).status().message(),
              HasSubstr("expected torus:ROWSxCOLS"));
  EXPECT_THAT(Topology::Parse("edges:0-1-2", 3).status().message(),
              HasSubstr("is not A-B or A-B:WEIGHT"));
  EXPECT_THAT(Topology::Parse("star", 3).status().message(),
              HasSubstr("unknown topology 'star'"));
  EXPECT_THAT(Topology::Parse("ring", 0).status().message(),
              HasSubstr("world size 0 is not in [1, 65536]"));
}

TEST(ValidateMixingMatrixTest, RefusesWhatIsNotSymmetricDoublyStochastic) {
  EXPECT_TRUE(ValidateMixingMatrix({0.5, 0.5, 0.5, 0.5}, 2).ok());
  EXPECT_THAT(ValidateMixingMatrix({0.6, 0.4, 0.5, 0.5}, 2).message(),
              HasSubstr("not symmetric: entry (0, 1) is 0.4 but (1, 0) is "
                        "0.5"));
  EXPECT_THAT(ValidateMixingMatrix({0.6, 0.5, 0.5, 0.5}, 2).message(),
              HasSubstr("row 0 sums to 1.1; expected 1"));
  EXPECT_THAT(ValidateMixingMatrix({1.5, -0.5, -0.5, 1.5}, 2).message(),
              HasSubstr("entry (0, 1) is -0.5; expected non-negative"));
  EXPECT_THAT(ValidateMixingMatrix({1.0, 0.0, 0.0}, 2).message(),
              HasSubstr("3 entries; expected 2 x 2"));
}

}  // namespace
}  // namespace gradcomp::service
