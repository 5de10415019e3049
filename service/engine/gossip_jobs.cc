#include "service/engine/gossip_jobs.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "service/gossip/topology.h"

namespace gradcomp::service {

struct GossipJobs::Job {
  ReduceMode mode = ReduceMode::kAverage;  // guarded by GossipJobs::mu_
  absl::Mutex mu;                          // held through the spec check
  std::string spec ABSL_GUARDED_BY(mu);    // DescribeGossipSpec, once checked
  std::unique_ptr<GossipNode> node ABSL_GUARDED_BY(mu);
  int64_t checks ABSL_GUARDED_BY(mu) = 0;  // the check's rendezvous step
};

std::string DescribeGossipSpec(const GossipSpec& spec) {
  if (spec.choco_topk_fraction != 0) {
    return absl::StrCat("topology '", spec.topology, "', Choco-Gossip top-k ",
                        spec.choco_topk_fraction, ", ",
                        spec.power_steps == 0 ? 1 : spec.power_steps,
                        " step(s), diffusion ",
                        spec.diffusion == 0 ? 1.0 : spec.diffusion);
  }
  return absl::StrCat("topology '", spec.topology, "', rank ", spec.rank,
                      spec.rank == 0 ? " (exact gossip)" : "", ", ",
                      spec.power_steps == 0 ? 1 : spec.power_steps,
                      " power step(s), diffusion ",
                      spec.diffusion == 0 ? 1.0 : spec.diffusion,
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
  GC_ASSIGN_OR_RETURN(
      std::vector<codecs::Bytes> specs,
      collective_->Allgather(
          {std::string(job), std::string(kGossipSpecKey), entry->checks++, 0},
          described));
  const int me = collective_->rank();
  for (size_t r = 0; r < specs.size(); ++r) {
    if (specs[r] != described) {
      return absl::InvalidArgumentError(absl::StrCat(
          "job '", job, "': ranks disagree on the gossip spec: rank ", me,
          " has ", described, ", rank ", r, " has ", specs[r]));
    }
  }
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
  entry->node =
      std::make_unique<GossipNode>(*std::move(topology), me, checked, seed_);
  entry->spec = described;
  return entry->node.get();
}

}  // namespace gradcomp::service
