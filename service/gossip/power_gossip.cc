#include "service/gossip/power_gossip.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "Eigen/Core"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "codecs/cpu/linalg.h"
#include "codecs/random.h"
#include "service/gossip/choco_gossip.h"
#include "service/gossip/gossip_message.h"

namespace gradcomp::service {
namespace {

using RowMatrix =
    Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMap = Eigen::Map<const RowMatrix>;
using Map = Eigen::Map<RowMatrix>;

// The Philox stream of edge (lo, hi) for `tensor`: `purpose` tells the
// first draw and the draws of rounds without warm start ("#gossip", keyed
// by the round) from the redraws after a zero factor ("#gossip-redraw",
// keyed by the power step), so no two draws share numbers.
codecs::PhiloxStream EdgeStream(uint64_t seed, const std::string& tensor,
                                absl::string_view purpose, int lo, int hi,
                                int64_t index) {
  return codecs::PhiloxStream(
      seed, codecs::TensorId(absl::StrCat(tensor, purpose)), index,
      (static_cast<uint32_t>(lo) << 16) | static_cast<uint32_t>(hi));
}

// The state buffer of the edge with `neighbour` (power_gossip.h); -1 names
// this rank's own Choco copy, "gossip.self.hat".
std::string EdgeBuffer(int neighbour, absl::string_view what) {
  if (neighbour < 0) return absl::StrCat("gossip.self.", what);
  return absl::StrCat("gossip.", neighbour, ".", what);
}

// Choco's step count, in 24-bit halves like an edge's power steps.
constexpr absl::string_view kChocoMeta = "gossip.choco";

// An edge's scalars as exact floats: the power step count in 24-bit
// halves, the next step's side and r_eff.
constexpr size_t kMetaSize = 4;
constexpr uint64_t kMetaHalf = uint64_t{1} << 24;

// A scalar SaveEdges or SaveChoco wrote is a whole number in [0, limit); an
// imported blob may hold anything (NaN, -1, 0.5), which a cast would not
// survive.
bool WholeBelow(float v, uint64_t limit) {
  return v >= 0 && v < static_cast<float>(limit) && v == std::floor(v);
}

// Power steps, or Choco steps, from their two 24-bit halves.
absl::StatusOr<uint64_t> StepCount(float low, float high,
                                   absl::string_view what) {
  if (!WholeBelow(low, kMetaHalf) || !WholeBelow(high, kMetaHalf)) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " has step count halves ", low, " and ", high,
                     ", expected whole numbers in [0, 2^24)"));
  }
  return static_cast<uint64_t>(low) + static_cast<uint64_t>(high) * kMetaHalf;
}

// One neighbour exchange of a gossip step, its error naming the tensor and
// the step.
absl::StatusOr<std::vector<codecs::Bytes>> Exchange(
    Collective& collective, const RoundKey& key, absl::Span<const int> ranks,
    std::vector<codecs::Bytes> parts) {
  absl::StatusOr<std::vector<codecs::Bytes>> got =
      collective.ExchangeWithNeighbours(key, ranks, std::move(parts));
  if (!got.ok()) {
    return absl::Status(
        got.status().code(),
        absl::StrCat("gossip of tensor '", key.tensor, "' step ", key.step,
                     ": ", got.status().message()));
  }
  return got;
}

// A low-rank message of this edge's rank r and tensor shape that ran a
// different number of power steps (or is at the other factor) than `mine`:
// the edge's ends are out of step, not sending unrelated tensors.
bool OutOfStep(const GossipMessageHeader& came,
               const GossipMessageHeader& mine) {
  const bool low_rank =
      came.kind == GossipKind::kLeft || came.kind == GossipKind::kRight;
  return low_rank && came.rank == mine.rank &&
         came.shape_hash == mine.shape_hash &&
         (came.power_step != mine.power_step || came.kind != mine.kind);
}

// A neighbour's message that could not be read, named as Exchange names
// the step.
absl::Status BadMessage(const RoundKey& key, int from,
                        const absl::Status& why) {
  return absl::InvalidArgumentError(
      absl::StrCat("gossip of tensor '", key.tensor, "' step ", key.step,
                   " with rank ", from, ": ", why.message()));
}

// Finite inputs whose values, or differences with the neighbours', come
// near FLT_MAX can mix to Inf (or NaN: Inf - Inf) in fp32, and a mix that
// extrapolates (diffusion above 1) can leave the caller's narrower range:
// values of magnitude `out_of_range` or more, which its dtype holds as Inf.
absl::Status MixedBeyondFloatRange(const RoundKey& key,
                                   absl::Span<const float> x,
                                   float out_of_range) {
  size_t count = 0;
  size_t first = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::fabs(x[i]) < out_of_range) continue;  // false for NaN
    if (count++ == 0) first = i;
  }
  if (count == 0) return absl::OkStatus();
  const std::string what =
      absl::StrCat("gossip of tensor '", key.tensor, "' step ", key.step,
                   ": mixing with the neighbours ");
  if (std::isinf(out_of_range)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, "overflowed float range in ", count, " values (first at index ",
        first, ": ", x[first],
        "); the tensor's values or their differences with the neighbours' "
        "are too close to ",
        std::numeric_limits<float>::max(),
        " for fp32, so this rank does not apply the round"));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      what, "left the range of the tensor's dtype in ", count,
      " values (first at index ", first, ": ", x[first],
      "), which it holds as Inf from a magnitude of ", out_of_range,
      "; the mix extrapolates (diffusion above 1) past it, so this rank "
      "does not apply the round"));
}

}  // namespace

absl::Status ValidateGossipOptions(const GossipOptions& options) {
  if (options.rank < 1 || options.rank > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("gossip rank ", options.rank, " is not in [1, 1024]"));
  }
  if (options.iterations < 1 || options.iterations > 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gossip iterations ", options.iterations, " is not in [1, 64]"));
  }
  if (!(options.exact_gamma > 0 && options.exact_gamma <= 2)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gossip exact_gamma ", options.exact_gamma, " is not in (0, 2]"));
  }
  if (options.mode == GossipOptions::Mode::kChoco &&
      !(options.gamma > 0 && options.gamma <= 2)) {
    return absl::InvalidArgumentError(
        absl::StrCat("gossip gamma ", options.gamma,
                     " is not in (0, 2] (Choco-Gossip's consensus step size)"));
  }
  // PowerGossip's bound depends on the edge weights: ValidateGossipRate.
  if (!(options.gamma > 0 && std::isfinite(options.gamma))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gossip gamma ", options.gamma, " is not a finite value > 0"));
  }
  if (options.mode == GossipOptions::Mode::kChoco) {
    return ValidateChocoFraction(options.choco_fraction);
  }
  return absl::OkStatus();
}

double MaxEdgeWeight(const Topology& topology) {
  double w = 0;
  for (int i = 0; i < topology.world_size(); ++i) {
    for (const Neighbour& n : topology.neighbours(i)) w = std::max(w, n.weight);
  }
  return w;
}

double MaxNeighbourWeightSum(const Topology& topology) {
  double most = 0;
  for (int i = 0; i < topology.world_size(); ++i) {
    double sum = 0;
    for (const Neighbour& n : topology.neighbours(i)) sum += n.weight;
    most = std::max(most, sum);
  }
  return most;
}

absl::Status ValidateGossipRate(const GossipOptions& options,
                                const Topology& topology) {
  GC_RETURN_IF_ERROR(ValidateGossipOptions(options));
  if (options.mode == GossipOptions::Mode::kChoco) return absl::OkStatus();
  const double s = MaxNeighbourWeightSum(topology);
  if (options.exact_gamma * s >= 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        options.mode == GossipOptions::Mode::kExact
            ? "exact gossip diffusion "
            : "exact gossip diffusion (of the 1-D tensors) ",
        options.exact_gamma, " on topology '", topology.name(),
        "' (largest sum of a rank's edge weights ", s,
        "): expected gamma < 1 / ", s, " = ", 1 / s,
        "; above it the eigenvalues of I - gamma (I - W) may leave (-1, 1) "
        "and plain gossip diverge"));
  }
  if (options.mode != GossipOptions::Mode::kPowerGossip) {
    return absl::OkStatus();
  }
  const double w = MaxEdgeWeight(topology);
  if (options.gamma * w >= 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PowerGossip diffusion ", options.gamma, " on topology '",
        topology.name(), "' (largest edge weight ", w,
        "): expected gamma < 1 / ", w, " = ", 1 / w,
        "; a power step scales an edge's difference in its factors' span by "
        "1 - 2 gamma w_ij, which must lie in (-1, 1)"));
  }
  return absl::OkStatus();
}

struct GossipNode::TensorGossip {
  struct Edge {
    EdgeFactors factors;
    bool next_uses_q = true;  // power step t odd
  };
  absl::Mutex mu;
  std::vector<int64_t> shape ABSL_GUARDED_BY(mu);
  // Indexed like the topology's neighbours of this rank; empty until the
  // first low-rank round.
  std::vector<Edge> edges ABSL_GUARDED_BY(mu);
  // Choco: x_hat_i, and x_hat_j indexed like the neighbours; empty until
  // the first Choco round.
  std::vector<float> own_hat ABSL_GUARDED_BY(mu);
  std::vector<std::vector<float>> hats ABSL_GUARDED_BY(mu);
  uint64_t choco_steps ABSL_GUARDED_BY(mu) = 0;
};

GossipNode::GossipNode(Topology topology, int rank, GossipOptions options,
                       uint64_t seed)
    : topology_(std::move(topology)),
      rank_(rank),
      options_(options),
      seed_(seed) {}

GossipNode::~GossipNode() = default;

uint64_t GossipWorkingBytes(const GossipOptions& options, size_t degree,
                            absl::Span<const int64_t> shape) {
  uint64_t numel = 1;
  for (int64_t d : shape) numel *= static_cast<uint64_t>(d);
  const uint64_t tensor = numel * sizeof(float);
  if (options.mode == GossipOptions::Mode::kChoco) {
    // The copies x_hat of this rank and each neighbour, loaded from the
    // state; the difference and its index order; k pairs each way per
    // neighbour.
    const uint64_t k = static_cast<uint64_t>(
        ChocoK(options.choco_fraction, static_cast<int64_t>(numel)));
    return (degree + 2) * tensor + numel * sizeof(uint32_t) +
           2 * degree * k * 8;
  }
  const bool low_rank = options.mode == GossipOptions::Mode::kPowerGossip &&
                        shape.size() >= 2 && shape[0] > 0;
  if (!low_rank) {
    // A copy of x to every neighbour and one from each; this end's x and
    // the neighbour's at hand.
    return (2 * degree + 2) * tensor;
  }
  const uint64_t rows = static_cast<uint64_t>(shape[0]);
  const uint64_t cols = numel / rows;
  const uint64_t r =
      std::min<uint64_t>({static_cast<uint64_t>(options.rank), rows, cols});
  // Per edge its factors (loaded from the state), a factor-sized input and
  // message each way; this end's x.
  return degree * 4 * (rows + cols) * r * sizeof(float) + tensor;
}

absl::StatusOr<GossipNode::TensorGossip*> GossipNode::Tensor(
    const std::string& name) {
  absl::MutexLock lock(&mu_);
  std::unique_ptr<TensorGossip>& t = tensors_[name];
  if (t == nullptr) t = std::make_unique<TensorGossip>();
  return t.get();
}

absl::StatusOr<GossipNode::TensorGossip*> GossipNode::Existing(
    const std::string& name) const {
  absl::MutexLock lock(&mu_);
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no gossip state for tensor '", name, "'"));
  }
  return it->second.get();
}

uint64_t GossipNode::WorkingBytes(absl::Span<const int64_t> shape) const {
  return GossipWorkingBytes(options_, topology_.neighbours(rank_).size(),
                            shape);
}

absl::StatusOr<GossipStats> GossipNode::Round(Collective& collective,
                                              const RoundKey& key,
                                              absl::Span<const int64_t> shape,
                                              absl::Span<float> x) {
  GC_ASSIGN_OR_RETURN(TensorGossip * t, Tensor(key.tensor));
  absl::MutexLock lock(&t->mu);
  GC_ASSIGN_OR_RETURN(GossipStats stats,
                      RoundOn(*t, collective, key, shape, x));
  GC_RETURN_IF_ERROR(
      MixedBeyondFloatRange(key, x, std::numeric_limits<float>::infinity()));
  return stats;
}

absl::StatusOr<GossipStats> GossipNode::Round(Collective& collective,
                                              const RoundKey& key,
                                              absl::Span<const int64_t> shape,
                                              absl::Span<float> x,
                                              codecs::TensorState& state,
                                              float out_of_range) {
  TensorGossip t;
  absl::MutexLock lock(&t.mu);
  absl::Status loaded = LoadEdges(state, shape, t);
  if (!loaded.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("gossip state of tensor '", key.tensor,
                     "' does not fit this round: ", loaded.message()));
  }
  GC_ASSIGN_OR_RETURN(GossipStats stats, RoundOn(t, collective, key, shape, x));
  GC_RETURN_IF_ERROR(MixedBeyondFloatRange(key, x, out_of_range));
  SaveEdges(t, state);
  return stats;
}

absl::Status GossipNode::LoadEdges(const codecs::TensorState& state,
                                   absl::Span<const int64_t> shape,
                                   TensorGossip& t) const {
  t.shape.assign(shape.begin(), shape.end());
  if (options_.mode == GossipOptions::Mode::kChoco) {
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    return LoadChoco(state, numel, t);
  }
  const absl::Span<const Neighbour> neighbours = topology_.neighbours(rank_);
  const auto& buffers = state.buffers();
  auto find = [&](int j, absl::string_view what) -> const std::vector<float>* {
    auto it = buffers.find(EdgeBuffer(j, what));
    return it == buffers.end() ? nullptr : &it->second;
  };
  size_t present = 0;
  for (const Neighbour& n : neighbours)
    present += find(n.rank, "meta") != nullptr;
  if (present == 0) return absl::OkStatus();
  if (present != neighbours.size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "it holds edges for ", present, " of this rank's ", neighbours.size(),
        " neighbours in topology '", topology_.name(), "'"));
  }
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  const int64_t rows = shape.empty() ? numel : shape[0];
  const int64_t cols = rows == 0 ? 0 : numel / rows;
  t.edges.resize(neighbours.size());
  for (size_t e = 0; e < neighbours.size(); ++e) {
    const int j = neighbours[e].rank;
    const std::vector<float>& meta = *find(j, "meta");
    const std::vector<float>* p = find(j, "p");
    const std::vector<float>* q = find(j, "q");
    if (meta.size() != kMetaSize || q == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the edge with rank ", j, " lacks its q factor or scalars"));
    }
    const std::string edge_name = absl::StrCat("the edge with rank ", j);
    GC_ASSIGN_OR_RETURN(const uint64_t power_steps,
                        StepCount(meta[0], meta[1], edge_name));
    if (!WholeBelow(meta[2], 2) || !WholeBelow(meta[3], kMetaHalf)) {
      return absl::FailedPreconditionError(
          absl::StrCat(edge_name, " has side ", meta[2], " and factor rank ",
                       meta[3], ", expected 0 or 1 and a whole number"));
    }
    const bool next_uses_q = meta[2] != 0;
    const int r = static_cast<int>(meta[3]);
    // The rank this job's options give RoundOn, which sizes its buffers by
    // it: factors of another rank (state saved under other options) would
    // be read past their end.
    const int want_r =
        static_cast<int>(std::min<int64_t>({options_.rank, rows, cols}));
    if (options_.mode == GossipOptions::Mode::kPowerGossip && r != want_r) {
      return absl::FailedPreconditionError(
          absl::StrCat("the edge with rank ", j, " holds rank-", r,
                       " factors, but this job's options give rank ", want_r,
                       " for shape [", absl::StrJoin(shape, ","),
                       "] (state saved with another gossip rank?)"));
    }
    const size_t want_p = static_cast<size_t>(rows) * r;
    const size_t want_q = static_cast<size_t>(cols) * r;
    // p is empty until the first step multiplies by q; a step that
    // multiplies by p needs all of it.
    const size_t p_size = p == nullptr ? 0 : p->size();
    if (r < 1 || q->size() != want_q || (p_size != 0 && p_size != want_p) ||
        (!next_uses_q && p_size == 0)) {
      return absl::FailedPreconditionError(absl::StrCat(
          edge_name, " holds rank ", r, " factors of ", p_size, " and ",
          q->size(), " values, expected ", want_p, " and ", want_q,
          " for shape [", absl::StrJoin(shape, ","), "]",
          next_uses_q ? "" : " (its next step multiplies by p)"));
    }
    TensorGossip::Edge& edge = t.edges[e];
    edge.factors.rows = rows;
    edge.factors.cols = cols;
    edge.factors.rank = r;
    edge.factors.power_steps = power_steps;
    edge.next_uses_q = next_uses_q;
    if (p != nullptr) edge.factors.p = *p;
    edge.factors.q = *q;
  }
  return absl::OkStatus();
}

absl::Status GossipNode::LoadChoco(const codecs::TensorState& state,
                                   int64_t numel, TensorGossip& t) const {
  const absl::Span<const Neighbour> neighbours = topology_.neighbours(rank_);
  const auto& buffers = state.buffers();
  auto meta = buffers.find(kChocoMeta);
  if (meta == buffers.end()) return absl::OkStatus();
  if (meta->second.size() != 2) {
    return absl::FailedPreconditionError(
        absl::StrCat("its Choco step count has ", meta->second.size(),
                     " values, expected 2"));
  }
  GC_ASSIGN_OR_RETURN(t.choco_steps, StepCount(meta->second[0], meta->second[1],
                                               "its Choco state"));
  t.hats.resize(neighbours.size());
  for (size_t e = 0; e <= neighbours.size(); ++e) {
    const std::string name = e == neighbours.size()
                                 ? EdgeBuffer(-1, "hat")
                                 : EdgeBuffer(neighbours[e].rank, "hat");
    auto it = buffers.find(name);
    if (it == buffers.end() ||
        it->second.size() != static_cast<size_t>(numel)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "Choco copy '", name, "' has ",
          it == buffers.end() ? 0 : it->second.size(), " values, expected ",
          numel, " (one per element, for each neighbour in topology '",
          topology_.name(), "')"));
    }
    (e == neighbours.size() ? t.own_hat : t.hats[e]) = it->second;
  }
  return absl::OkStatus();
}

void GossipNode::SaveEdges(const TensorGossip& t,
                           codecs::TensorState& state) const {
  const absl::Span<const Neighbour> neighbours = topology_.neighbours(rank_);
  if (!t.own_hat.empty()) {
    absl::Span<float> meta = state.Buffer(std::string(kChocoMeta), 2);
    meta[0] = static_cast<float>(t.choco_steps % kMetaHalf);
    meta[1] = static_cast<float>(t.choco_steps / kMetaHalf);
    for (size_t e = 0; e <= neighbours.size(); ++e) {
      const std::vector<float>& hat =
          e == neighbours.size() ? t.own_hat : t.hats[e];
      absl::Span<float> out = state.Buffer(
          EdgeBuffer(e == neighbours.size() ? -1 : neighbours[e].rank, "hat"),
          hat.size());
      std::copy(hat.begin(), hat.end(), out.begin());
    }
  }
  for (size_t e = 0; e < t.edges.size(); ++e) {
    const int j = neighbours[e].rank;
    const TensorGossip::Edge& edge = t.edges[e];
    const EdgeFactors& f = edge.factors;
    absl::Span<float> meta = state.Buffer(EdgeBuffer(j, "meta"), kMetaSize);
    meta[0] = static_cast<float>(f.power_steps % kMetaHalf);
    meta[1] = static_cast<float>(f.power_steps / kMetaHalf);
    meta[2] = edge.next_uses_q ? 1.0f : 0.0f;
    meta[3] = static_cast<float>(f.rank);
    absl::Span<float> p = state.Buffer(EdgeBuffer(j, "p"), f.p.size());
    std::copy(f.p.begin(), f.p.end(), p.begin());
    absl::Span<float> q = state.Buffer(EdgeBuffer(j, "q"), f.q.size());
    std::copy(f.q.begin(), f.q.end(), q.begin());
  }
}

absl::StatusOr<GossipStats> GossipNode::RoundOn(TensorGossip& tensor,
                                                Collective& collective,
                                                const RoundKey& key,
                                                absl::Span<const int64_t> shape,
                                                absl::Span<float> x) {
  TensorGossip* t = &tensor;
  GC_RETURN_IF_ERROR(ValidateGossipRate(options_, topology_));
  if (collective.rank() != rank_ ||
      collective.world_size() != topology_.world_size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "gossip on rank ", rank_, " of topology '", topology_.name(), "' over ",
        topology_.world_size(), " ranks, but the collective is rank ",
        collective.rank(), " of ", collective.world_size()));
  }
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  if (numel < 0 || static_cast<uint64_t>(numel) != x.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", key.tensor, "': shape [", absl::StrJoin(shape, ","),
        "] has ", numel, " elements but ", x.size(), " values were given"));
  }
  const absl::Span<const Neighbour> neighbours = topology_.neighbours(rank_);
  GossipStats stats;
  stats.bytes_to_neighbour.assign(neighbours.size(), 0);
  if (neighbours.empty() || numel == 0) return stats;

  if (!std::equal(shape.begin(), shape.end(), t->shape.begin(),
                  t->shape.end())) {
    t->shape.assign(shape.begin(), shape.end());
    t->edges.clear();
    t->own_hat.clear();
    t->hats.clear();
    t->choco_steps = 0;
  }
  if (options_.mode == GossipOptions::Mode::kChoco) {
    return ChocoRoundOn(*t, collective, key, x);
  }
  const uint32_t shape_hash = GossipShapeHash(shape);
  const bool low_rank = options_.mode == GossipOptions::Mode::kPowerGossip &&
                        shape.size() >= 2 && shape[0] > 0;
  const int64_t rows = low_rank ? shape[0] : numel;
  const int64_t cols = low_rank ? numel / rows : 1;
  const int r =
      static_cast<int>(std::min<int64_t>({options_.rank, rows, cols}));
  if (low_rank && (t->edges.empty() || !options_.warm_start)) {
    // The first round (or, without warm start, every round) starts from
    // fresh Gaussian q, the same at both ends of each edge.
    const int64_t draw = t->edges.empty() ? 0 : key.step + 1;
    t->edges.resize(neighbours.size());
    for (size_t e = 0; e < neighbours.size(); ++e) {
      EdgeFactors& f = t->edges[e].factors;
      f.rows = rows;
      f.cols = cols;
      f.rank = r;
      f.q.resize(static_cast<size_t>(cols) * r);
      codecs::FillGaussian(
          EdgeStream(seed_, key.tensor, "#gossip",
                     std::min(rank_, neighbours[e].rank),
                     std::max(rank_, neighbours[e].rank), draw),
          0, absl::MakeSpan(f.q));
      t->edges[e].next_uses_q = true;
    }
  }

  std::vector<float> own;  // X at the step's start
  // Per edge: the step's input and this end's message X input (X^T input).
  std::vector<std::vector<float>> inputs(neighbours.size());
  std::vector<std::vector<float>> mine(neighbours.size());
  std::vector<float> theirs;
  for (int it = 0; it < options_.iterations; ++it) {
    RoundKey step_key = key;
    step_key.round = it;
    std::vector<codecs::Bytes> parts(neighbours.size());
    std::vector<int> ranks(neighbours.size());
    std::vector<GossipMessageHeader> headers(neighbours.size());
    own.assign(x.begin(), x.end());
    for (size_t e = 0; e < neighbours.size(); ++e) {
      ranks[e] = neighbours[e].rank;
      GossipMessageHeader& h = headers[e];
      if (!low_rank) {
        h = {GossipKind::kPlain, 0, 0, static_cast<uint64_t>(numel),
             shape_hash};
        WriteGossipMessage(h, own, &parts[e]);
      } else {
        TensorGossip::Edge& edge = t->edges[e];
        EdgeFactors& f = edge.factors;
        const bool left = edge.next_uses_q;  // send X orth(q), rows x r
        const int64_t in_rows = left ? cols : rows;
        std::vector<float>& input = inputs[e];
        input = left ? f.q : f.p;
        if (codecs::OrthonormalizeColumns(absl::MakeSpan(input), in_rows, r) >
            0) {
          // A zero factor (the ends were equal at the last step) would stop
          // this edge for good: start it again from a shared random draw.
          codecs::FillGaussian(EdgeStream(seed_, key.tensor, "#gossip-redraw",
                                          std::min(rank_, neighbours[e].rank),
                                          std::max(rank_, neighbours[e].rank),
                                          static_cast<int64_t>(f.power_steps)),
                               0, absl::MakeSpan(input));
          codecs::OrthonormalizeColumns(absl::MakeSpan(input), in_rows, r);
        }
        const int64_t out_rows = left ? rows : cols;
        std::vector<float>& message = mine[e];
        message.resize(static_cast<size_t>(out_rows) * r);
        ConstMap xm(own.data(), rows, cols);
        ConstMap in(input.data(), in_rows, r);
        Map out(message.data(), out_rows, r);
        if (left) {
          out.noalias() = xm * in;
        } else {
          out.noalias() = xm.transpose() * in;
        }
        h = {left ? GossipKind::kLeft : GossipKind::kRight,
             static_cast<uint32_t>(r), f.power_steps + 1,
             static_cast<uint64_t>(out_rows) * r, shape_hash};
        WriteGossipMessage(h, message, &parts[e]);
      }
      stats.bytes_to_neighbour[e] += parts[e].size();
      stats.bytes_sent += parts[e].size();
    }

    absl::StatusOr<std::vector<codecs::Bytes>> got =
        Exchange(collective, step_key, ranks, std::move(parts));
    if (!got.ok()) return got.status();

    for (size_t e = 0; e < neighbours.size(); ++e) {
      const int j = neighbours[e].rank;
      const bool lo = rank_ < j;
      if (low_rank) {
        const absl::StatusOr<GossipMessageHeader> came =
            ReadGossipHeader((*got)[e]);
        if (came.ok() && OutOfStep(*came, headers[e])) {
          // The neighbour sees the same from this end's message: both draw
          // the same fresh q and count the same steps from here.
          const uint64_t steps =
              std::max(came->power_step, headers[e].power_step);
          TensorGossip::Edge& edge = t->edges[e];
          edge.factors.power_steps = steps;
          edge.factors.p.clear();
          codecs::FillGaussian(
              EdgeStream(seed_, key.tensor, "#gossip-resync",
                         std::min(rank_, j), std::max(rank_, j),
                         static_cast<int64_t>(steps)),
              0, absl::MakeSpan(edge.factors.q));
          edge.next_uses_q = true;
          stats.resynced.push_back(
              {j, headers[e].power_step, came->power_step});
          continue;
        }
      }
      theirs.resize(headers[e].count);
      absl::Status read =
          ReadGossipMessage((*got)[e], headers[e], absl::MakeSpan(theirs));
      if (!read.ok()) return BadMessage(key, j, read);
      // Both ends form d = hi - lo from the same two vectors, and the same
      // float increment c * A, which the low end adds and the high end
      // subtracts.
      const float c = static_cast<float>(
          (low_rank ? options_.gamma : options_.exact_gamma) *
          neighbours[e].weight);
      if (!low_rank) {
        for (int64_t i = 0; i < numel; ++i) {
          const float d = lo ? theirs[i] - own[i] : own[i] - theirs[i];
          const float a = c * d;
          x[i] = lo ? x[i] + a : x[i] - a;
        }
        continue;
      }
      TensorGossip::Edge& edge = t->edges[e];
      EdgeFactors& f = edge.factors;
      const bool left = edge.next_uses_q;
      const std::vector<float>& m = mine[e];
      std::vector<float>& d = left ? f.p : f.q;  // the next warm start
      d.resize(m.size());
      for (size_t i = 0; i < d.size(); ++i) {
        d[i] = lo ? theirs[i] - m[i] : m[i] - theirs[i];
      }
      const std::vector<float>& input = inputs[e];
      // A = d input^T (left: rows x r times (cols x r)^T) or input d^T.
      const float* a_rows = left ? d.data() : input.data();
      const float* a_cols = left ? input.data() : d.data();
      for (int64_t i = 0; i < rows; ++i) {
        const float* ri = a_rows + i * r;
        float* xi = x.data() + i * cols;
        for (int64_t jj = 0; jj < cols; ++jj) {
          const float* cj = a_cols + jj * r;
          float a = 0;
          for (int k = 0; k < r; ++k) a += ri[k] * cj[k];
          a *= c;
          xi[jj] = lo ? xi[jj] + a : xi[jj] - a;
        }
      }
      ++f.power_steps;
      edge.next_uses_q = !edge.next_uses_q;
    }
  }
  return stats;
}

absl::StatusOr<GossipStats> GossipNode::ChocoRoundOn(TensorGossip& t,
                                                     Collective& collective,
                                                     const RoundKey& key,
                                                     absl::Span<float> x) {
  const int64_t numel = static_cast<int64_t>(x.size());
  if (numel > int64_t{UINT32_MAX}) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", key.tensor, "' has ", numel,
        " elements; Choco-Gossip's 32-bit indices allow at most ", UINT32_MAX));
  }
  const absl::Span<const Neighbour> neighbours = topology_.neighbours(rank_);
  if (t.own_hat.empty()) {
    t.own_hat.assign(x.size(), 0.0f);
    t.hats.assign(neighbours.size(), std::vector<float>(x.size(), 0.0f));
    t.choco_steps = 0;
  }
  const int64_t k = ChocoK(options_.choco_fraction, numel);
  GossipStats stats;
  stats.bytes_to_neighbour.assign(neighbours.size(), 0);
  std::vector<int> ranks(neighbours.size());
  for (size_t e = 0; e < neighbours.size(); ++e) ranks[e] = neighbours[e].rank;
  std::vector<float> diff(x.size());
  std::vector<uint32_t> indices;
  std::vector<float> values(k);
  std::vector<uint32_t> their_indices(k);
  std::vector<float> their_values(k);
  const float gamma = static_cast<float>(options_.gamma);
  for (int it = 0; it < options_.iterations; ++it) {
    RoundKey step_key = key;
    step_key.round = it;
    for (int64_t i = 0; i < numel; ++i) diff[i] = x[i] - t.own_hat[i];
    TopKIndices(diff, k, &indices);
    for (int64_t i = 0; i < k; ++i) {
      values[i] = diff[indices[i]];
      t.own_hat[indices[i]] += values[i];
    }
    const GossipMessageHeader header{GossipKind::kSparse, 0, t.choco_steps + 1,
                                     static_cast<uint64_t>(k),
                                     GossipShapeHash(t.shape)};
    std::vector<codecs::Bytes> parts(neighbours.size());
    for (size_t e = 0; e < neighbours.size(); ++e) {
      WriteSparseGossipMessage(header, indices, values, &parts[e]);
      stats.bytes_to_neighbour[e] += parts[e].size();
      stats.bytes_sent += parts[e].size();
    }
    absl::StatusOr<std::vector<codecs::Bytes>> got =
        Exchange(collective, step_key, ranks, std::move(parts));
    if (!got.ok()) return got.status();
    for (size_t e = 0; e < neighbours.size(); ++e) {
      absl::Status read = ReadSparseGossipMessage(
          (*got)[e], header, static_cast<uint64_t>(numel),
          absl::MakeSpan(their_indices), absl::MakeSpan(their_values));
      if (!read.ok()) return BadMessage(key, neighbours[e].rank, read);
      std::vector<float>& hat = t.hats[e];
      for (int64_t i = 0; i < k; ++i) {
        hat[their_indices[i]] += their_values[i];
      }
    }
    ++t.choco_steps;
    for (int64_t i = 0; i < numel; ++i) {
      float mix = 0;
      for (size_t e = 0; e < neighbours.size(); ++e) {
        mix += static_cast<float>(neighbours[e].weight) *
               (t.hats[e][i] - t.own_hat[i]);
      }
      x[i] += gamma * mix;
    }
  }
  return stats;
}

absl::StatusOr<std::vector<float>> GossipNode::ChocoCopy(
    const std::string& tensor, int owner) const {
  GC_ASSIGN_OR_RETURN(TensorGossip * t, Existing(tensor));
  absl::MutexLock lock(&t->mu);
  if (t->own_hat.empty()) {
    return absl::NotFoundError(
        absl::StrCat("tensor '", tensor, "' has had no Choco round"));
  }
  if (owner == rank_) return t->own_hat;
  const absl::Span<const Neighbour> neighbours = topology_.neighbours(rank_);
  for (size_t e = 0; e < neighbours.size(); ++e) {
    if (neighbours[e].rank == owner) return t->hats[e];
  }
  return absl::NotFoundError(absl::StrCat("rank ", owner,
                                          " is not a neighbour of rank ", rank_,
                                          " in '", topology_.name(), "'"));
}

absl::StatusOr<EdgeFactors> GossipNode::Factors(const std::string& tensor,
                                                int neighbour) const {
  GC_ASSIGN_OR_RETURN(TensorGossip * t, Existing(tensor));
  absl::MutexLock lock(&t->mu);
  const absl::Span<const Neighbour> neighbours = topology_.neighbours(rank_);
  for (size_t e = 0; e < neighbours.size() && e < t->edges.size(); ++e) {
    if (neighbours[e].rank == neighbour) return t->edges[e].factors;
  }
  return absl::NotFoundError(absl::StrCat(
      "tensor '", tensor, "' has no PowerGossip factors with rank ", neighbour,
      " (not a neighbour, or no low-rank round yet)"));
}

double ConsensusDistance(absl::Span<const std::vector<float>> xs) {
  if (xs.empty()) return 0;
  const size_t n = xs[0].size();
  std::vector<double> mean(n, 0.0);
  for (const auto& x : xs) {
    for (size_t i = 0; i < n; ++i) mean[i] += x[i];
  }
  for (double& m : mean) m /= xs.size();
  double sum = 0;
  for (const auto& x : xs) {
    for (size_t i = 0; i < n; ++i) {
      const double diff = x[i] - mean[i];
      sum += diff * diff;
    }
  }
  return sum / xs.size();
}

}  // namespace gradcomp::service
