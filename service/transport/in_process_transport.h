// W transports inside one process, for tests of the collectives: a Send
// hands a copy of the bytes straight to the receiving rank's Receiver, on
// the sender's thread. A rank can be cut off (Kill) and brought back
// (Revive) to test failure handling without sockets.
//
//   InProcessHub hub(4);
//   std::unique_ptr<Transport> t0 = hub.Connect(0, &mailbox0);
//   hub.Kill(3);  // ranks 0-2 get OnPeerLost(3); sends to 3 fail
#ifndef GRADCOMP_SERVICE_TRANSPORT_IN_PROCESS_TRANSPORT_H_
#define GRADCOMP_SERVICE_TRANSPORT_IN_PROCESS_TRANSPORT_H_

#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "service/transport/transport.h"

namespace gradcomp::service {

class InProcessHub {
 public:
  explicit InProcessHub(int world_size);

  // The transport of `rank`; `receiver` gets what the other ranks send it
  // and must outlive the hub's use. The hub must outlive the transport.
  std::unique_ptr<Transport> Connect(int rank, Receiver* receiver)
      ABSL_LOCKS_EXCLUDED(mu_);

  // `rank` goes away: every other connected rank gets OnPeerLost(rank), and
  // sends to or from it fail with Unavailable until Revive(rank).
  void Kill(int rank) ABSL_LOCKS_EXCLUDED(mu_);
  void Revive(int rank) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  class Endpoint;

  absl::Status Deliver(int from, int to, const MessageKey& key,
                       codecs::Bytes data) ABSL_LOCKS_EXCLUDED(mu_);

  const int world_size_;
  absl::Mutex mu_;
  std::vector<Receiver*> receivers_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> alive_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_TRANSPORT_IN_PROCESS_TRANSPORT_H_
