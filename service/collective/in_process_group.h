// W ranks' PeerCollectives in one process, over an InProcessHub: for tests
// and single-process replays of what W daemons compute.
//
//   InProcessGroup group(4);
//   // on rank r's thread:
//   GC_ASSIGN_OR_RETURN(auto result, group.collective(r).Run(key, round));
#ifndef GRADCOMP_SERVICE_COLLECTIVE_IN_PROCESS_GROUP_H_
#define GRADCOMP_SERVICE_COLLECTIVE_IN_PROCESS_GROUP_H_

#include <memory>
#include <vector>

#include "absl/time/time.h"
#include "service/collective/mailbox.h"
#include "service/collective/peer_collective.h"
#include "service/transport/in_process_transport.h"

namespace gradcomp::service {

class InProcessGroup {
 public:
  explicit InProcessGroup(int world_size,
                          absl::Duration timeout = absl::Seconds(60));

  int world_size() const { return static_cast<int>(collectives_.size()); }
  InProcessHub& hub() { return hub_; }
  PeerCollective& collective(int rank) { return *collectives_[rank]; }

 private:
  InProcessHub hub_;
  std::vector<std::unique_ptr<Mailbox>> mailboxes_;
  std::vector<std::unique_ptr<Transport>> transports_;
  std::vector<std::unique_ptr<PeerCollective>> collectives_;
};

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_COLLECTIVE_IN_PROCESS_GROUP_H_
