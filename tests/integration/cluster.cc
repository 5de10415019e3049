#include "tests/integration/cluster.h"

#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "base/free_port.h"

namespace gradcomp::testing {

double Sample(const std::string& page, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(page, '\n')) {
    if (absl::ConsumePrefix(&line, series + " ")) {
      double value = 0;
      if (absl::SimpleAtod(line, &value)) return value;
    }
  }
  return -1;
}

Cluster::Cluster(int world_size, absl::Duration collective_timeout,
                 std::vector<std::string> extra_args, uint64_t seed)
    : world_size_(world_size),
      timeout_(collective_timeout),
      extra_args_(std::move(extra_args)),
      seed_(seed) {
  for (int r = 0; r < world_size_; ++r) {
    peers_.push_back(absl::StrCat("127.0.0.1:", *FreePort()));
  }
  daemons_.resize(world_size_);
}

absl::Status Cluster::Start(int rank) {
  auto binary = DaemonBinary();
  if (!binary.ok()) return binary.status();
  std::vector<std::string> peers = peers_;
  for (const auto& [route, address] : routes_) {
    if (route.first == rank) peers[route.second] = address;
  }
  std::vector<std::string> args = {
      absl::StrCat("--world_size=", world_size_), absl::StrCat("--rank=", rank),
      absl::StrCat("--peers=", absl::StrJoin(peers, ",")),
      absl::StrCat("--seed=", seed_),
      absl::StrCat("--collective_timeout=", absl::FormatDuration(timeout_))};
  args.insert(args.end(), extra_args_.begin(), extra_args_.end());
  auto daemon = DaemonProcess::Start(*binary, args);
  if (!daemon.ok()) return daemon.status();
  daemons_[rank] = std::move(*daemon);
  return absl::OkStatus();
}

void Cluster::Route(int rank, int peer, std::string address) {
  routes_[{rank, peer}] = std::move(address);
}

absl::Status Cluster::StartAll() {
  for (int r = 0; r < world_size_; ++r) {
    if (absl::Status started = Start(r); !started.ok()) return started;
  }
  return WaitMeshUp();
}

absl::Status Cluster::WaitMeshUp() {
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  for (int r = 0; r < world_size_; ++r) {
    while (true) {
      auto page = HttpGet(daemons_[r]->metrics_port(), "/metrics");
      if (page.ok() && Sample(*page, "gradcomp_peers_up") == world_size_ - 1) {
        break;
      }
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("rank ", r, " never saw all its peers; log:\n",
                         daemons_[r]->Log()));
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
  }
  return absl::OkStatus();
}

}  // namespace gradcomp::testing
