#include "service/collective/in_process_group.h"

namespace gradcomp::service {

InProcessGroup::InProcessGroup(int world_size, absl::Duration timeout)
    : hub_(world_size) {
  for (int r = 0; r < world_size; ++r) {
    mailboxes_.push_back(
        std::make_unique<Mailbox>(world_size, MailboxOptions{}, nullptr));
    transports_.push_back(hub_.Connect(r, mailboxes_[r].get()));
    collectives_.push_back(std::make_unique<PeerCollective>(
        transports_[r].get(), mailboxes_[r].get(),
        PeerCollectiveOptions{timeout}, nullptr));
  }
}

}  // namespace gradcomp::service
