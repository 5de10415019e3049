#include "service/transport/in_process_transport.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace gradcomp::service {

class InProcessHub::Endpoint : public Transport {
 public:
  Endpoint(InProcessHub* hub, int rank) : hub_(hub), rank_(rank) {}

  int rank() const override { return rank_; }
  int world_size() const override { return hub_->world_size_; }
  std::string PeerName(int rank) const override {
    return absl::StrCat("rank ", rank, " (in-process)");
  }
  absl::Status SendMessage(int to, const MessageKey& key,
                           OutgoingMessage message,
                           absl::Time /*deadline*/) override {
    codecs::Bytes data;
    data.reserve(message.size());
    for (absl::string_view part : message.parts) {
      data.append(part.data(), part.size());
    }
    return hub_->Deliver(rank_, to, key, std::move(data));
  }

 private:
  InProcessHub* const hub_;
  const int rank_;
};

InProcessHub::InProcessHub(int world_size)
    : world_size_(world_size),
      receivers_(world_size, nullptr),
      alive_(world_size, true) {}

std::unique_ptr<Transport> InProcessHub::Connect(int rank, Receiver* receiver) {
  absl::MutexLock lock(&mu_);
  receivers_[rank] = receiver;
  return std::make_unique<Endpoint>(this, rank);
}

absl::Status InProcessHub::Deliver(int from, int to, const MessageKey& key,
                                   codecs::Bytes data) {
  Receiver* receiver;
  {
    absl::MutexLock lock(&mu_);
    if (to < 0 || to >= world_size_ || to == from) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", from, " sends to rank ", to,
                       ", expected another rank in [0, ", world_size_, ")"));
    }
    if (!alive_[from] || !alive_[to] || receivers_[to] == nullptr) {
      return absl::UnavailableError(absl::StrCat(
          "rank ", to, " (in-process) is not reachable from rank ", from));
    }
    receiver = receivers_[to];
  }
  // Outside the lock: the receiver may block a little and others send too.
  receiver->OnMessage(from, key, std::move(data));
  return absl::OkStatus();
}

void InProcessHub::Kill(int rank) {
  std::vector<Receiver*> others;
  {
    absl::MutexLock lock(&mu_);
    alive_[rank] = false;
    for (int r = 0; r < world_size_; ++r) {
      if (r != rank && alive_[r] && receivers_[r] != nullptr) {
        others.push_back(receivers_[r]);
      }
    }
  }
  const absl::Status why = absl::UnavailableError(
      absl::StrCat("rank ", rank, " (in-process) was killed"));
  for (Receiver* receiver : others) receiver->OnPeerLost(rank, why);
}

void InProcessHub::Revive(int rank) {
  absl::MutexLock lock(&mu_);
  alive_[rank] = true;
}

}  // namespace gradcomp::service
