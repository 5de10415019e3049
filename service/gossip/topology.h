// Who gossips with whom, and how much: a topology over W ranks (ring, 2-D
// torus, full, or an explicit weighted edge list) and its mixing matrix.
// Gossip preserves the network mean only when that matrix is symmetric,
// doubly stochastic and non-negative, so every constructor checks it, and
// refuses a graph that is not connected (its ranks would never agree).
//
//   GC_ASSIGN_OR_RETURN(Topology ring, Topology::Parse("ring", 8));
//   for (const Neighbour& n : ring.neighbours(rank)) Exchange(n.rank, ...);
//
// Weights are Metropolis-Hastings, w_ij = 1 / (1 + max(deg i, deg j)), where
// an edge list does not give its own: on regular graphs that is the uniform
// 1 / (deg + 1) (ring 1/3, 2-D torus 1/5, full 1/W).
#ifndef GRADCOMP_SERVICE_GOSSIP_TOPOLOGY_H_
#define GRADCOMP_SERVICE_GOSSIP_TOPOLOGY_H_

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace gradcomp::service {

// An undirected edge of an explicit list; no weight means Metropolis-Hastings.
struct Edge {
  int a = 0;
  int b = 0;
  std::optional<double> weight;
};

struct Neighbour {
  int rank = 0;
  double weight = 0;  // w_ij of the mixing matrix, > 0
};

class Topology {
 public:
  // Each rank i is joined to i - 1 and i + 1 (mod W). W = 1 has no edges,
  // W = 2 one.
  static absl::StatusOr<Topology> Ring(int world_size);
  // W = rows x cols ranks on a grid that wraps both ways; rank r*cols + c is
  // joined to (r +- 1, c) and (r, c +- 1). A side of 2 gives one neighbour
  // that way, a side of 1 none.
  static absl::StatusOr<Topology> Torus(int rows, int cols);
  // Every rank joined to every other.
  static absl::StatusOr<Topology> Full(int world_size);
  static absl::StatusOr<Topology> FromEdges(int world_size,
                                            absl::Span<const Edge> edges);
  // "ring", "full", "torus" (the most square rows x cols = W), "torus:RxC",
  // or "edges:0-1,1-2:0.25,..." (a:b, optionally ":weight").
  static absl::StatusOr<Topology> Parse(absl::string_view spec, int world_size);

  int world_size() const { return static_cast<int>(neighbours_.size()); }
  const std::string& name() const { return name_; }
  // Sorted by rank.
  absl::Span<const Neighbour> neighbours(int rank) const {
    return neighbours_[rank];
  }
  // w_ii = 1 - sum of the rank's edge weights.
  double self_weight(int rank) const;
  // The W x W mixing matrix, row-major.
  std::vector<double> MixingMatrix() const;

 private:
  Topology(std::string name, std::vector<std::vector<Neighbour>> neighbours)
      : name_(std::move(name)), neighbours_(std::move(neighbours)) {}
  // The topology of `edges` (a < b, each once), missing weights filled by
  // Metropolis-Hastings; refuses a disconnected graph or an invalid matrix.
  static absl::StatusOr<Topology> Build(std::string name, int world_size,
                                        const std::vector<Edge>& edges);

  std::string name_;
  std::vector<std::vector<Neighbour>> neighbours_;
};

// OK when the n x n row-major matrix `w` is symmetric, has non-negative
// entries and rows that sum to 1, each within `tolerance`; otherwise an
// InvalidArgument naming the first entry or row that is not.
absl::Status ValidateMixingMatrix(absl::Span<const double> w, int n,
                                  double tolerance = 1e-12);

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_GOSSIP_TOPOLOGY_H_
