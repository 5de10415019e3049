#include "service/gossip/topology.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/status_macros.h"

namespace gradcomp::service {
namespace {

// Ranks are packed into the 16 + 16 bits of an edge's Philox key
// (power_gossip.h), and a mixing matrix grows as W^2.
constexpr int kMaxWorldSize = 65536;

absl::Status CheckWorldSize(absl::string_view what, int world_size) {
  if (world_size < 1 || world_size > kMaxWorldSize) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": world size ", world_size, " is not in [1, ",
                     kMaxWorldSize, "]"));
  }
  return absl::OkStatus();
}

// Ranks that rank 0 cannot reach, in order.
std::vector<int> Unreachable(const std::vector<std::vector<Neighbour>>& adj) {
  std::vector<bool> seen(adj.size(), false);
  std::vector<int> todo = {0};
  seen[0] = true;
  while (!todo.empty()) {
    const int i = todo.back();
    todo.pop_back();
    for (const Neighbour& n : adj[i]) {
      if (!seen[n.rank]) {
        seen[n.rank] = true;
        todo.push_back(n.rank);
      }
    }
  }
  std::vector<int> out;
  for (size_t i = 0; i < seen.size(); ++i) {
    if (!seen[i]) out.push_back(static_cast<int>(i));
  }
  return out;
}

// Unique undirected edges from a list of pairs that may repeat (a ring of
// 2, a torus side of 2) or join a rank to itself (a torus side of 1).
std::vector<Edge> Dedup(const std::vector<std::pair<int, int>>& pairs) {
  std::set<std::pair<int, int>> unique;
  for (auto [a, b] : pairs) {
    if (a != b) unique.insert({std::min(a, b), std::max(a, b)});
  }
  std::vector<Edge> edges;
  for (auto [a, b] : unique) edges.push_back({a, b, std::nullopt});
  return edges;
}

}  // namespace

// Builds the topology of `edges` (a < b, no duplicates, checked by the
// callers), filling missing weights by Metropolis-Hastings, and checks
// that it is connected and that its mixing matrix is valid.
absl::StatusOr<Topology> Topology::Build(std::string name, int world_size,
                                         const std::vector<Edge>& edges) {
  std::vector<int> degree(world_size, 0);
  for (const Edge& e : edges) {
    ++degree[e.a];
    ++degree[e.b];
  }
  std::vector<std::vector<Neighbour>> adj(world_size);
  for (const Edge& e : edges) {
    const double w = e.weight.has_value()
                         ? *e.weight
                         : 1.0 / (1 + std::max(degree[e.a], degree[e.b]));
    adj[e.a].push_back({e.b, w});
    adj[e.b].push_back({e.a, w});
  }
  for (auto& list : adj) {
    std::sort(
        list.begin(), list.end(),
        [](const Neighbour& x, const Neighbour& y) { return x.rank < y.rank; });
  }
  const std::vector<int> lost = Unreachable(adj);
  if (!lost.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "topology '", name, "' over ", world_size,
        " ranks is not connected: rank 0 cannot reach rank(s) ",
        absl::StrJoin(lost, ", "),
        "; expected a connected graph (its ranks would never agree)"));
  }
  Topology topology(std::move(name), std::move(adj));
  absl::Status valid =
      ValidateMixingMatrix(topology.MixingMatrix(), world_size, 1e-9);
  if (!valid.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("topology '", topology.name(), "': ", valid.message()));
  }
  return topology;
}

absl::StatusOr<Topology> Topology::Ring(int world_size) {
  GC_RETURN_IF_ERROR(CheckWorldSize("ring", world_size));
  std::vector<std::pair<int, int>> pairs;
  for (int i = 0; i < world_size; ++i) {
    pairs.push_back({i, (i + 1) % world_size});
  }
  return Build("ring", world_size, Dedup(pairs));
}

absl::StatusOr<Topology> Topology::Torus(int rows, int cols) {
  if (rows < 1 || cols < 1 ||
      static_cast<int64_t>(rows) * cols > kMaxWorldSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("torus ", rows, "x", cols, ": expected rows, cols >= 1 ",
                     "and at most ", kMaxWorldSize, " ranks"));
  }
  std::vector<std::pair<int, int>> pairs;
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) {
      const int me = r * cols + c;
      pairs.push_back({me, ((r + 1) % rows) * cols + c});
      pairs.push_back({me, r * cols + (c + 1) % cols});
    }
  }
  return Build(absl::StrCat("torus:", rows, "x", cols), rows * cols,
               Dedup(pairs));
}

absl::StatusOr<Topology> Topology::Full(int world_size) {
  GC_RETURN_IF_ERROR(CheckWorldSize("full", world_size));
  std::vector<std::pair<int, int>> pairs;
  for (int i = 0; i < world_size; ++i) {
    for (int j = i + 1; j < world_size; ++j) pairs.push_back({i, j});
  }
  return Build("full", world_size, Dedup(pairs));
}

absl::StatusOr<Topology> Topology::FromEdges(int world_size,
                                             absl::Span<const Edge> edges) {
  GC_RETURN_IF_ERROR(CheckWorldSize("edge list", world_size));
  std::set<std::pair<int, int>> seen;
  std::vector<Edge> sorted;
  for (const Edge& e : edges) {
    if (e.a < 0 || e.b < 0 || e.a >= world_size || e.b >= world_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "edge ", e.a, "-", e.b, ": expected ranks in [0, ", world_size, ")"));
    }
    if (e.a == e.b) {
      return absl::InvalidArgumentError(absl::StrCat(
          "edge ", e.a, "-", e.b,
          " joins a rank to itself; expected two different ranks (the "
          "self weight is what the edges leave over)"));
    }
    if (e.weight.has_value() && !(*e.weight > 0 && *e.weight <= 1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "edge ", e.a, "-", e.b, ": weight ", *e.weight, " is not in (0, 1]"));
    }
    const std::pair<int, int> key{std::min(e.a, e.b), std::max(e.a, e.b)};
    if (!seen.insert(key).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("edge ", key.first, "-", key.second,
                       " is listed twice; expected each edge once (edges are "
                       "undirected)"));
    }
    sorted.push_back({key.first, key.second, e.weight});
  }
  return Build("edges", world_size, sorted);
}

absl::StatusOr<Topology> Topology::Parse(absl::string_view spec,
                                         int world_size) {
  if (spec == "ring") return Ring(world_size);
  if (spec == "full") return Full(world_size);
  if (spec == "torus") {
    GC_RETURN_IF_ERROR(CheckWorldSize("torus", world_size));
    int rows = 1;
    for (int r = 1; static_cast<int64_t>(r) * r <= world_size; ++r) {
      if (world_size % r == 0) rows = r;
    }
    return Torus(rows, world_size / rows);
  }
  absl::string_view rest = spec;
  if (absl::ConsumePrefix(&rest, "torus:")) {
    std::vector<absl::string_view> sides = absl::StrSplit(rest, 'x');
    int rows = 0;
    int cols = 0;
    if (sides.size() != 2 || !absl::SimpleAtoi(sides[0], &rows) ||
        !absl::SimpleAtoi(sides[1], &cols)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "topology '", spec, "': expected torus:ROWSxCOLS, e.g. torus:2x4"));
    }
    if (static_cast<int64_t>(rows) * cols != world_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("topology '", spec, "' has ", int64_t{rows} * cols,
                       " ranks but the world size is ", world_size));
    }
    return Torus(rows, cols);
  }
  if (absl::ConsumePrefix(&rest, "edges:")) {
    std::vector<Edge> edges;
    for (absl::string_view item : absl::StrSplit(rest, ',')) {
      std::vector<absl::string_view> fields = absl::StrSplit(item, ':');
      std::vector<absl::string_view> ends = absl::StrSplit(fields[0], '-');
      Edge e;
      double w = 0;
      if (fields.size() > 2 || ends.size() != 2 ||
          !absl::SimpleAtoi(ends[0], &e.a) ||
          !absl::SimpleAtoi(ends[1], &e.b) ||
          (fields.size() == 2 && !absl::SimpleAtod(fields[1], &w))) {
        return absl::InvalidArgumentError(absl::StrCat(
            "topology '", spec, "': edge '", item,
            "' is not A-B or A-B:WEIGHT (e.g. edges:0-1,1-2:0.25)"));
      }
      if (fields.size() == 2) e.weight = w;
      edges.push_back(e);
    }
    return FromEdges(world_size, edges);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown topology '", spec,
                   "'; expected ring, full, torus, torus:RxC or "
                   "edges:A-B[:W],..."));
}

double Topology::self_weight(int rank) const {
  double sum = 0;
  for (const Neighbour& n : neighbours_[rank]) sum += n.weight;
  return 1.0 - sum;
}

std::vector<double> Topology::MixingMatrix() const {
  const int w = world_size();
  std::vector<double> m(static_cast<size_t>(w) * w, 0.0);
  for (int i = 0; i < w; ++i) {
    m[static_cast<size_t>(i) * w + i] = self_weight(i);
    for (const Neighbour& n : neighbours_[i]) {
      m[static_cast<size_t>(i) * w + n.rank] = n.weight;
    }
  }
  return m;
}

absl::Status ValidateMixingMatrix(absl::Span<const double> w, int n,
                                  double tolerance) {
  if (n < 1 || w.size() != static_cast<size_t>(n) * n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mixing matrix has ", w.size(), " entries; expected ", n, " x ", n));
  }
  for (int i = 0; i < n; ++i) {
    double row = 0;
    for (int j = 0; j < n; ++j) {
      const double wij = w[static_cast<size_t>(i) * n + j];
      const double wji = w[static_cast<size_t>(j) * n + i];
      if (!(wij >= -tolerance)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "mixing matrix entry (", i, ", ", j, ") is ", wij,
            "; expected non-negative weights (a rank's edge weights may sum "
            "to at most 1)"));
      }
      if (!(std::fabs(wij - wji) <= tolerance)) {
        return absl::InvalidArgumentError(
            absl::StrCat("mixing matrix is not symmetric: entry (", i, ", ", j,
                         ") is ", wij, " but (", j, ", ", i, ") is ", wji));
      }
      row += wij;
    }
    if (!(std::fabs(row - 1.0) <= tolerance * n)) {
      return absl::InvalidArgumentError(
          absl::StrCat("mixing matrix row ", i, " sums to ", row,
                       "; expected 1 (doubly stochastic)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace gradcomp::service
