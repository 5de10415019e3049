#include "service/engine/gossip_jobs.h"

#include <algorithm>
#include <charconv>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/blocking_wait.h"
#include "base/start_thread.h"
#include "base/status_macros.h"
#include "service/gossip/topology.h"

namespace gradcomp::service {

struct GossipJobs::Job {
  ReduceMode mode = ReduceMode::kAverage;  // guarded by GossipJobs::mu_
  absl::Mutex mu;                          // held through the spec check
  std::string spec ABSL_GUARDED_BY(mu);    // DescribeGossipSpec, once checked
  std::unique_ptr<GossipNode> node ABSL_GUARDED_BY(mu);
  // By rank, until the node is built: the spec that rank sent when it named
  // this rank's (empty: none yet). A check that fails keeps them, because a
  // rank that has passed sends no more; the next check asks only the others.
  std::vector<std::string> agreed ABSL_GUARDED_BY(mu);
};

namespace {

// The rendezvous key of the check between ranks `a` and `b`: the same on
// both, and one per pair, so that each rank's message is collected alone
// and a check that fails on one rank uses up none of the others'.
RoundKey SpecCheckKey(absl::string_view job, int a, int b) {
  std::string pair =
      absl::StrCat(kGossipSpecKey, ":", std::min(a, b), "-", std::max(a, b));
  return {std::string(job), std::move(pair), 0, 0};
}

}  // namespace

namespace {

// The shortest text that reads back as `value`: ranks compare their specs'
// descriptions, and StrCat's six digits would let 1.308 and 1.3080049 pass
// as one diffusion rate, whose two ends' increments then differ.
std::string Exact(double value) {
  char text[32];
  const std::to_chars_result written =
      std::to_chars(text, text + sizeof(text), value);
  return std::string(text, written.ptr);
}

}  // namespace

std::string DescribeGossipSpec(const GossipSpec& spec) {
  const std::string diffusion =
      Exact(spec.diffusion == 0 ? 1.0 : spec.diffusion);
  if (spec.choco_topk_fraction != 0) {
    return absl::StrCat("topology '", spec.topology, "', Choco-Gossip top-k ",
                        Exact(spec.choco_topk_fraction), ", ",
                        spec.power_steps == 0 ? 1 : spec.power_steps,
                        " step(s), diffusion ", diffusion);
  }
  return absl::StrCat("topology '", spec.topology, "', rank ", spec.rank,
                      spec.rank == 0 ? " (exact gossip)" : "", ", ",
                      spec.power_steps == 0 ? 1 : spec.power_steps,
                      " power step(s), diffusion ", diffusion,
                      spec.fresh_factors ? ", fresh factors every round" : "");
}

absl::StatusOr<GossipOptions> GossipOptionsFromSpec(const GossipSpec& spec) {
  if (spec.topology.empty()) {
    return absl::InvalidArgumentError(
        "gossip mode needs gossip.topology: 'ring', 'torus', 'torus:RxC', "
        "'full' or 'edges:a-b[:w],...'");
  }
  const bool choco = spec.choco_topk_fraction != 0;
  if (choco &&
      !(spec.choco_topk_fraction > 0 && spec.choco_topk_fraction <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("gossip.choco_topk_fraction is ", spec.choco_topk_fraction,
                     ", expected 0 (no Choco-Gossip) or the share of each "
                     "tensor's entries sent per round, in (0, 1]"));
  }
  if (choco && spec.rank != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gossip.choco_topk_fraction is ", spec.choco_topk_fraction,
        " and gossip.rank ", spec.rank,
        ": Choco-Gossip and PowerGossip exclude each other, expected rank 0 "
        "with a Choco fraction"));
  }
  if (spec.fresh_factors && (choco || spec.rank == 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gossip.fresh_factors is set with gossip.rank ", spec.rank,
        choco ? absl::StrCat(" and gossip.choco_topk_fraction ",
                             spec.choco_topk_fraction)
              : "",
        ": fresh factors every round are a PowerGossip option, expected "
        "rank > 0 without a Choco fraction (exact gossip and Choco-Gossip "
        "have no factors)"));
  }
  GossipOptions options;
  options.mode = choco            ? GossipOptions::Mode::kChoco
                 : spec.rank == 0 ? GossipOptions::Mode::kExact
                                  : GossipOptions::Mode::kPowerGossip;
  if (choco) options.choco_fraction = spec.choco_topk_fraction;
  if (spec.rank > 0) options.rank = static_cast<int>(spec.rank);
  options.warm_start = !spec.fresh_factors;
  if (spec.power_steps > 0) {
    options.iterations = static_cast<int>(spec.power_steps);
  }
  const double diffusion = spec.diffusion == 0 ? 1.0 : spec.diffusion;
  options.gamma = diffusion;
  // A PowerGossip job's 1-D tensors gossip exactly, whose rate stays in
  // (0, 2]: above 2, they gossip at 1, the mixing matrix itself (and Node
  // lowers it to 1 wherever the topology makes plain gossip diverge).
  options.exact_gamma = diffusion <= 2 ? diffusion : 1.0;
  if (options.mode != GossipOptions::Mode::kPowerGossip && diffusion > 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gossip.diffusion is ", diffusion,
        ", expected a step size in (0, 2] for exact gossip and Choco-Gossip "
        "(only PowerGossip, gossip.rank > 0, takes more)"));
  }
  if (spec.rank > 1024 || spec.power_steps > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("gossip.rank is ", spec.rank, " and gossip.power_steps ",
                     spec.power_steps,
                     ", expected rank in [0, 1024] and power_steps in "
                     "[0, 64]"));
  }
  absl::Status valid = ValidateGossipOptions(options);
  if (!valid.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("gossip.diffusion is ", diffusion,
                     ", expected a step size > 0: ", valid.message()));
  }
  return options;
}

GossipJobs::GossipJobs(Collective* collective, uint64_t seed)
    : collective_(collective), seed_(seed) {}

GossipJobs::~GossipJobs() = default;

absl::Status GossipJobs::CheckAverage(absl::string_view job) {
  absl::MutexLock lock(&mu_);
  std::shared_ptr<Job>& entry = jobs_[job];
  if (entry == nullptr) entry = std::make_shared<Job>();
  if (entry->mode == ReduceMode::kGossip) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job '", job,
        "' reduces in gossip mode on this daemon; a request in average mode "
        "was refused (a job's mode must be the same in every request)"));
  }
  return absl::OkStatus();
}

void GossipJobs::Erase(absl::string_view job) {
  absl::MutexLock lock(&mu_);
  jobs_.erase(job);
}

uint64_t GossipJobs::WorkingBytesAhead(absl::string_view job,
                                       const GossipSpec& spec,
                                       absl::Span<const int64_t> shape) {
  std::shared_ptr<Job> entry;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(job);
    if (it != jobs_.end()) entry = it->second;
  }
  // A job's lock is held through its spec check, which waits for the other
  // ranks: then, as before the check, the spec is read on its own.
  if (entry != nullptr && entry->mu.TryLock()) {
    const bool built =
        entry->node != nullptr && entry->spec == DescribeGossipSpec(spec);
    const uint64_t bytes = built ? entry->node->WorkingBytes(shape) : 0;
    entry->mu.Unlock();
    if (built) return bytes;
  }
  const absl::StatusOr<GossipOptions> options = GossipOptionsFromSpec(spec);
  if (!options.ok()) return 0;
  const absl::StatusOr<Topology> topology =
      Topology::Parse(spec.topology, collective_->world_size());
  if (!topology.ok()) return 0;
  return GossipWorkingBytes(
      *options, topology->neighbours(collective_->rank()).size(), shape);
}

absl::StatusOr<GossipNode*> GossipJobs::Node(absl::string_view job,
                                             const GossipSpec& spec) {
  GC_ASSIGN_OR_RETURN(const GossipOptions options, GossipOptionsFromSpec(spec));
  const std::string described = DescribeGossipSpec(spec);
  std::shared_ptr<Job> entry;
  {
    absl::MutexLock lock(&mu_);
    std::shared_ptr<Job>& slot = jobs_[job];
    if (slot == nullptr) {
      slot = std::make_shared<Job>();
      slot->mode = ReduceMode::kGossip;
    }
    if (slot->mode != ReduceMode::kGossip) {
      return absl::InvalidArgumentError(absl::StrCat(
          "job '", job,
          "' reduces in average mode on this daemon; a request in gossip mode "
          "was refused (a job's mode must be the same in every request)"));
    }
    entry = slot;
  }
  absl::MutexLock lock(&entry->mu);
  if (entry->node != nullptr) {
    if (entry->spec != described) {
      return absl::InvalidArgumentError(absl::StrCat(
          "job '", job, "' gossips with ", entry->spec,
          " on this daemon, but this request names ", described,
          " (a job's gossip spec must be the same in every request)"));
    }
    return entry->node.get();
  }
  // What this rank can tell alone is refused at once, not after the check
  // has waited for every other rank: the topology and the diffusion depend
  // only on the spec and the world size, which the handshake made the same
  // on every rank.
  absl::StatusOr<Topology> topology =
      Topology::Parse(spec.topology, collective_->world_size());
  if (!topology.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job '", job, "': gossip topology '", spec.topology, "' for ",
        collective_->world_size(), " workers: ", topology.status().message()));
  }
  // A PowerGossip job's 1-D tensors gossip exactly: at its diffusion where
  // that is stable for plain gossip, else at 1, the mixing matrix itself.
  GossipOptions checked = options;
  if (checked.mode == GossipOptions::Mode::kPowerGossip &&
      checked.exact_gamma * MaxNeighbourWeightSum(*topology) >= 1) {
    checked.exact_gamma = 1.0;
  }
  absl::Status rate = ValidateGossipRate(checked, *topology);
  if (!rate.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("job '", job, "': gossip.diffusion for ",
                     collective_->world_size(), " workers: ", rate.message()));
  }
  // The check: this rank's spec goes to every rank that has not yet sent
  // the same, each pair at its own key, all at once (one thread per pair,
  // this one for the first), so that every wait names only a rank that is
  // really missing. Not one allgather: its wait takes every rank's message
  // at one key, and one that fails drops those it got, including those of
  // ranks that have passed and will not send theirs again.
  const int me = collective_->rank();
  const int world = collective_->world_size();
  entry->agreed.resize(world);
  std::vector<int> ask;
  for (int r = 0; r < world; ++r) {
    if (r != me && entry->agreed[r] != described) ask.push_back(r);
  }
  std::vector<absl::StatusOr<codecs::Bytes>> got(
      ask.size(), absl::UnknownError("not asked"));
  auto exchange = [&](size_t i) {
    const int neighbour[] = {ask[i]};
    absl::StatusOr<std::vector<codecs::Bytes>> one =
        collective_->ExchangeWithNeighbours(SpecCheckKey(job, me, ask[i]),
                                            neighbour, {described});
    if (one.ok()) {
      got[i] = std::move((*one)[0]);
    } else {
      got[i] = one.status();
    }
  };
  {
    // All pairs at once; a pair whose thread cannot be started fails with
    // that reason, like one whose neighbour did not answer.
    std::vector<std::thread> threads;
    for (size_t i = 1; i < ask.size(); ++i) {
      absl::StatusOr<std::thread> started =
          StartThread([&exchange, i] { exchange(i); }, "a gossip spec check");
      if (started.ok()) {
        threads.push_back(*std::move(started));
      } else {
        got[i] = started.status();
      }
    }
    if (!ask.empty()) exchange(0);
    // The other pairs wait on their neighbours (base/blocking_wait.h).
    ScopedBlockingWait joining;
    for (std::thread& t : threads) t.join();
  }
  std::vector<int> failed;
  const absl::Status* first_failure = nullptr;
  for (size_t i = 0; i < ask.size(); ++i) {
    if (!got[i].ok()) {
      failed.push_back(ask[i]);
      if (first_failure == nullptr) first_failure = &got[i].status();
    } else if (*got[i] == described) {
      entry->agreed[ask[i]] = described;
    }
  }
  for (size_t i = 0; i < ask.size(); ++i) {
    if (got[i].ok() && *got[i] != described) {
      return absl::InvalidArgumentError(absl::StrCat(
          "job '", job, "': ranks disagree on the gossip spec: rank ", me,
          " has ", described, ", rank ", ask[i], " has ", *got[i]));
    }
  }
  if (first_failure != nullptr) {
    return absl::Status(
        first_failure->code(),
        absl::StrCat("job '", job, "': the gossip spec check with rank",
                     failed.size() > 1 ? "s " : " ",
                     absl::StrJoin(failed, ", "),
                     " failed (expected every rank to make a gossip request "
                     "of the job; this rank's next request asks again only "
                     "the ranks that have not agreed): ",
                     first_failure->message()));
  }
  entry->node =
      std::make_unique<GossipNode>(*std::move(topology), me, checked, seed_);
  entry->spec = described;
  entry->agreed = {};
  return entry->node.get();
}

}  // namespace gradcomp::service
