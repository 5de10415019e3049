// W real gradcompd processes on loopback that form one job's peer mesh:
// rank r listens for clients at daemon(r).target() and for peers on a port
// of its own, all with the same --seed and --collective_timeout.
//
//   Cluster cluster(8, absl::Seconds(30));
//   GC_RETURN_IF_ERROR(cluster.StartAll());
//   Client::Connect(cluster.daemon(3).target());
#ifndef GRADCOMP_TESTS_INTEGRATION_CLUSTER_H_
#define GRADCOMP_TESTS_INTEGRATION_CLUSTER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "tests/integration/daemon_process.h"

namespace gradcomp::testing {

// The value of an unlabelled sample of a /metrics page, or of
// `name{labels}` spelled exactly as the page does; -1 when absent.
double Sample(const std::string& page, const std::string& series);

class Cluster {
 public:
  // `extra_args` go to every daemon (e.g. a --config).
  Cluster(int world_size, absl::Duration collective_timeout,
          std::vector<std::string> extra_args = {}, uint64_t seed = 7);

  // Starts (or restarts) rank `rank`'s daemon.
  absl::Status Start(int rank);
  // Starts every rank and waits until the mesh is up.
  absl::Status StartAll();
  // Until every daemon reports all its peers connected both ways.
  absl::Status WaitMeshUp();
  // Rank `rank`, when started after this, dials rank `peer` at `address`
  // (a TcpRelay in front of peer_address(peer)) instead.
  void Route(int rank, int peer, std::string address);

  // "127.0.0.1:<port>": where rank `rank` listens for peers.
  const std::string& peer_address(int rank) const { return peers_[rank]; }

  int world_size() const { return world_size_; }
  DaemonProcess& daemon(int rank) { return *daemons_[rank]; }

 private:
  int world_size_;
  absl::Duration timeout_;
  std::vector<std::string> extra_args_;
  uint64_t seed_;
  std::vector<std::string> peers_;
  std::map<std::pair<int, int>, std::string> routes_;
  std::vector<std::unique_ptr<DaemonProcess>> daemons_;
};

}  // namespace gradcomp::testing

#endif  // GRADCOMP_TESTS_INTEGRATION_CLUSTER_H_
