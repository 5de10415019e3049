// Decentralised averaging (NEIGHBOURS rounds): each rank mixes its tensor
// with its topology neighbours' instead of taking the global mean, either
// exactly (plain gossip: the neighbours' whole tensors) or by PowerGossip
// (Vogels, Karimireddy, Jaggi, NeurIPS 2020), which sends per edge and power
// step one rank-r factor of the tensor, rows x r or cols x r values.
//
//   GossipNode node(topology, rank, GossipOptions{}, seed);
//   // every rank, each round, on its own thread or daemon:
//   GC_ASSIGN_OR_RETURN(GossipStats stats,
//       node.Round(collective, {job, "fc1.weight", step, 0}, shape, x));
//
// PowerGossip, per edge (lo, hi) = (min rank, max rank) and tensor, seen as
// the matrix X = x.view(shape[0], -1): both ends hold factors p (rows x r)
// and q (cols x r), q drawn first from a Philox stream keyed by the seed,
// the tensor and the edge. Power step t (counted per edge from 1) takes
// input = orth(q) when t is odd and orth(p) when even; each end sends
// X input (or X^T input) to the other; both form
// d = (X_hi - X_lo) input from the same two vectors, so d is bit-identical
// at both ends, and keep it as p (t odd) or q (t even), the next step's
// warm start; then with A = d input^T (or input d^T) and c = gamma w_ij,
// X_lo += c A and X_hi -= c A: the exact same float increment with
// opposite signs, so the network sum moves only by the rounding of the
// additions. Equal X_lo and X_hi give d = 0 and no change. Tensors with
// fewer than 2 dimensions, and every tensor in exact mode, gossip plainly:
// d = x_hi - x_lo, with c = exact_gamma w_ij.
//
// Every edge's update in a power step uses the X from the start of that
// step, so a step is one exchange with all neighbours at once.
//
// Choco-Gossip (Koloskova, Stich, Jaggi, ICML 2019; the top-k baseline of
// the PowerGossip paper), in Mode::kChoco, on every tensor seen flat: rank
// i keeps x_hat_i (its public copy) and x_hat_j of each neighbour, all
// starting at 0. A step sends q_i = topk(x_i - x_hat_i) (k =
// ChocoK(choco_fraction, n) indices and values, choco_gossip.h) to every
// neighbour, adds q_i to x_hat_i and each received q_j to x_hat_j (the
// same float additions on the same values as at j, so the copies agree bit
// for bit), then x_i += gamma sum_j w_ij (x_hat_j - x_hat_i).
//
// Thread-safe: many tensors may run at once (one at a time per tensor).
#ifndef GRADCOMP_SERVICE_GOSSIP_POWER_GOSSIP_H_
#define GRADCOMP_SERVICE_GOSSIP_POWER_GOSSIP_H_

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "codecs/state.h"
#include "service/collective/collective.h"
#include "service/gossip/topology.h"

namespace gradcomp::service {

struct GossipOptions {
  enum class Mode { kExact, kPowerGossip, kChoco };
  Mode mode = Mode::kPowerGossip;
  int rank = 1;        // r, in [1, 1024]; r_eff = min(r, rows, cols)
  int iterations = 1;  // power steps per round, in [1, 64]
  bool warm_start = true;
  // Diffusion rate of the low-rank steps (the paper's default): each step
  // removes only the part of the difference in the factors' span, so a
  // rate above 1 mixes faster. > 0, and below 1 / (the topology's largest
  // edge weight): ValidateGossipRate (docs/gossip.md, "How large a
  // diffusion"). Mode::kChoco: in (0, 2].
  double gamma = 1.308;
  // Diffusion rate of plain gossip, which removes the whole difference: 1
  // is the mixing matrix itself. In (0, 2].
  double exact_gamma = 1.0;
  // Mode::kChoco: the share of a tensor's entries sent per neighbour and
  // step, in (0, 1]; `gamma` is Choco's consensus step size.
  double choco_fraction = 0.01;
};

// The checks that need no topology: ranges of rank, iterations, the rates
// (gamma > 0; Choco's and exact_gamma in (0, 2]) and Choco's fraction.
absl::Status ValidateGossipOptions(const GossipOptions& options);

// ValidateGossipOptions, and with `topology`:
// - exact gossip (Mode::kExact, and PowerGossip's 1-D tensors): exact_gamma
//   s < 1, s = MaxNeighbourWeightSum. I - W's eigenvalues lie in [0, 2 s]
//   (Gershgorin), so every mode of plain gossip then contracts; on regular
//   bipartite graphs (an even ring, a 2 x 4 torus) 2 s is an eigenvalue and
//   the bound is exact (ring of 8: 1.5).
// - PowerGossip: gamma w_ij < 1 on every edge: a power step multiplies an
//   edge's difference in its factors' span by 1 - 2 gamma w_ij, so a larger
//   gamma makes even two nodes diverge. (Every data converges below exact
//   gossip's bound 2 / lambda_max(I - W); between the two it depends on the
//   data: docs/gossip.md.)
absl::Status ValidateGossipRate(const GossipOptions& options,
                                const Topology& topology);

// The largest w_ij over the edges of `topology` (0 without edges).
double MaxEdgeWeight(const Topology& topology);

// The largest sum of one rank's edge weights, max_i sum_j w_ij = max_i (1 -
// w_ii) (0 without edges).
double MaxNeighbourWeightSum(const Topology& topology);

// An estimate of the bytes a round of a tensor of `shape` allocates besides
// the tensor itself, on a rank with `degree` neighbours: the messages to
// and from every neighbour (a tensor each for exact gossip), and Choco's
// copies of its state. GossipNode::WorkingBytes for the node's own rank;
// alone, for a caller that has the options and the topology but no node.
uint64_t GossipWorkingBytes(const GossipOptions& options, size_t degree,
                            absl::Span<const int64_t> shape);

// One edge's PowerGossip factors for one tensor, identical at both ends.
struct EdgeFactors {
  int64_t rows = 0;
  int64_t cols = 0;
  int rank = 0;              // r_eff
  uint64_t power_steps = 0;  // steps run on this edge
  std::vector<float> p;      // rows x r, row-major (empty before step 1)
  std::vector<float> q;      // cols x r, row-major
};

// An edge whose ends had run different numbers of PowerGossip power steps
// (a round that failed at one end only, or a daemon restarted without its
// state). Both ends see it in the same power step, from each other's
// message, and start the edge again from the same fresh factors, at
// max(this_end, neighbour_end) steps; the edge adds nothing in that step.
struct EdgeResync {
  int neighbour = 0;
  uint64_t this_end = 0;       // the power step this end sent
  uint64_t neighbour_end = 0;  // the power step the neighbour sent
};

struct GossipStats {
  // Message bytes this rank sent to each neighbour in the round (indexed
  // like Topology::neighbours(rank)).
  std::vector<uint64_t> bytes_to_neighbour;
  uint64_t bytes_sent = 0;
  std::vector<EdgeResync> resynced;  // edges started again this round
};

class GossipNode {
 public:
  // `topology` and `rank` must match the collective's; `seed` must be the
  // same on every rank (it keys the edges' Philox streams).
  GossipNode(Topology topology, int rank, GossipOptions options, uint64_t seed);
  ~GossipNode();

  // One gossip round of `x` (a tensor of `shape`), in place: `iterations`
  // power steps, each an ExchangeWithNeighbours with key.round = the step's
  // index in the round. Every neighbour must run the same round of the
  // same tensor and shape. A shape change resets the tensor's edges.
  // InvalidArgument when the mix overflows float range (finite values or
  // differences near FLT_MAX): `x` then holds the overflowed mix.
  absl::StatusOr<GossipStats> Round(Collective& collective, const RoundKey& key,
                                    absl::Span<const int64_t> shape,
                                    absl::Span<float> x)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The same round with the tensor's edges kept in `state` (the daemon's
  // per-job codec state, so that they are exported, imported and freed
  // with it) instead of in this node: buffers "gossip.<neighbour>.p", ".q"
  // and ".meta" per edge (Choco: "gossip.self.hat", "gossip.<neighbour>.hat"
  // and "gossip.choco"). FailedPrecondition when `state` holds edges that
  // do not fit the shape, rank or topology (an import from another job).
  // `state` changes only when the round succeeds: a failed exchange, or a
  // mix beyond float range, leaves it as it was. `out_of_range` narrows
  // that range to the caller's dtype: a mix with a value of that magnitude
  // or more (which the dtype would hold as Inf: FirstMagnitudeToInf) fails
  // the same way.
  absl::StatusOr<GossipStats> Round(
      Collective& collective, const RoundKey& key,
      absl::Span<const int64_t> shape, absl::Span<float> x,
      codecs::TensorState& state,
      float out_of_range = std::numeric_limits<float>::infinity());

  // A copy of the factors of (tensor, neighbour); NotFound before the
  // tensor's first low-rank round.
  absl::StatusOr<EdgeFactors> Factors(const std::string& tensor,
                                      int neighbour) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Choco: a copy of the public copy x_hat of `owner` (this rank or a
  // neighbour) that this rank holds for `tensor`; NotFound before the
  // tensor's first Choco round or for a rank that is not a neighbour.
  absl::StatusOr<std::vector<float>> ChocoCopy(const std::string& tensor,
                                               int owner) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // GossipWorkingBytes of this node's options and rank: what a
  // state-backed Round of a tensor of `shape` allocates besides `x`.
  uint64_t WorkingBytes(absl::Span<const int64_t> shape) const;

  const Topology& topology() const { return topology_; }
  const GossipOptions& options() const { return options_; }

 private:
  struct TensorGossip;

  absl::StatusOr<TensorGossip*> Tensor(const std::string& name)
      ABSL_LOCKS_EXCLUDED(mu_);
  // NotFound unless `name` has had a round.
  absl::StatusOr<TensorGossip*> Existing(const std::string& name) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // The round itself, on `t` (whose lock the caller holds).
  absl::StatusOr<GossipStats> RoundOn(TensorGossip& t, Collective& collective,
                                      const RoundKey& key,
                                      absl::Span<const int64_t> shape,
                                      absl::Span<float> x);
  // Mode::kChoco's round, called by RoundOn once the arguments are checked.
  absl::StatusOr<GossipStats> ChocoRoundOn(TensorGossip& t,
                                           Collective& collective,
                                           const RoundKey& key,
                                           absl::Span<float> x);
  absl::Status LoadChoco(const codecs::TensorState& state, int64_t numel,
                         TensorGossip& t) const;
  absl::Status LoadEdges(const codecs::TensorState& state,
                         absl::Span<const int64_t> shape,
                         TensorGossip& t) const;
  void SaveEdges(const TensorGossip& t, codecs::TensorState& state) const;

  const Topology topology_;
  const int rank_;
  const GossipOptions options_;
  const uint64_t seed_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<TensorGossip>> tensors_
      ABSL_GUARDED_BY(mu_);
};

// sum_i ||x_i - mean||^2 / W over the ranks' tensors (all the same size):
// the consensus distance the experiments and tests track.
double ConsensusDistance(absl::Span<const std::vector<float>> xs);

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_GOSSIP_POWER_GOSSIP_H_
