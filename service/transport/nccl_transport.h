// Transport over NCCL point-to-point (ncclSend / ncclRecv) between daemons
// that each own a GPU: one communicator of `world_size` ranks, joined with an
// ncclUniqueId that rank 0 makes (NewNcclUniqueId) and hands the others.
//
//   GC_ASSIGN_OR_RETURN(std::unique_ptr<NcclTransport> t,
//                       NcclTransport::Create(options, &receiver));
//   GC_RETURN_IF_ERROR(t->Send(1, key, bytes, deadline));
//
// A progress thread runs rounds of NcclExchange with every other rank: in each
// it sends each peer the head of that peer's queue (or nothing) and delivers
// what arrives to the Receiver. All ranks must keep running, so a rank that
// stops or stalls past `peer_timeout` ends the communicator: it is aborted and
// every other rank is reported with OnPeerLost. Without a usable GPU, Create
// returns Unavailable.
#ifndef GRADCOMP_SERVICE_TRANSPORT_NCCL_TRANSPORT_H_
#define GRADCOMP_SERVICE_TRANSPORT_NCCL_TRANSPORT_H_

#include <cstddef>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "service/transport/transport.h"

namespace gradcomp::service {

class NcclExchange;

class NcclTransport : public Transport {
 public:
  struct Options {
    int rank = 0;
    int world_size = 1;
    // NewNcclUniqueId()'s bytes, the same on every rank.
    std::string unique_id;
    // The CUDA device this rank uses; every rank needs its own GPU (NCCL
    // refuses two ranks of one communicator on one device).
    int device = 0;
    // Messages waiting per peer before SendMessage blocks.
    size_t queue_limit = 64;
    // How long joining, and then any one round, may wait for the others.
    absl::Duration peer_timeout = absl::Seconds(30);
    // Pause after a round in which nothing moved, so idle ranks do not spin.
    absl::Duration idle_pause = absl::Milliseconds(1);
  };

  // Joins the communicator and starts the progress thread. `receiver` gets
  // what the other ranks send and must outlive the transport.
  static absl::StatusOr<std::unique_ptr<NcclTransport>> Create(
      const Options& options, Receiver* receiver);

  ~NcclTransport() override;

  int rank() const override { return options_.rank; }
  int world_size() const override { return options_.world_size; }
  std::string PeerName(int rank) const override;
  absl::Status SendMessage(int to, const MessageKey& key,
                           OutgoingMessage message,
                           absl::Time deadline) override
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Queued {
    std::string key;  // EncodeKey(key)
    OutgoingMessage message;
    absl::Time deadline;
  };

  NcclTransport(const Options& options, Receiver* receiver,
                std::unique_ptr<NcclExchange> exchange);

  void Progress() ABSL_LOCKS_EXCLUDED(mu_);
  // Takes, per peer, the first queued message still before its deadline.
  std::vector<std::unique_ptr<Queued>> TakeHeads() ABSL_LOCKS_EXCLUDED(mu_);
  void Fail(const absl::Status& why) ABSL_LOCKS_EXCLUDED(mu_);

  const Options options_;
  Receiver* const receiver_;
  std::unique_ptr<NcclExchange> exchange_;  // the progress thread's alone
  std::vector<int> peers_;                  // every rank but this one

  absl::Mutex mu_;
  std::vector<std::deque<std::unique_ptr<Queued>>> queues_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status broken_ ABSL_GUARDED_BY(mu_);

  std::thread progress_;
};

// The wire form of a MessageKey, which leads every NCCL payload; Decode
// returns the key and the offset of the data after it.
std::string EncodeNcclMessageKey(const MessageKey& key);
absl::StatusOr<std::pair<MessageKey, size_t>> DecodeNcclMessageKey(
    absl::string_view payload);

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_TRANSPORT_NCCL_TRANSPORT_H_
