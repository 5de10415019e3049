#include "service/transport/nccl_transport.h"

#include <cstdint>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "service/transport/nccl_transport_exchange.h"

namespace gradcomp::service {
namespace {

template <typename T>
void AppendFixed(std::string& out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  out.append(bytes, sizeof(T));
}

// Reads a T at `*offset` and advances it; false when the payload is too short.
template <typename T>
bool ReadFixed(absl::string_view payload, size_t* offset, T* value) {
  if (payload.size() - *offset < sizeof(T)) return false;
  std::memcpy(value, payload.data() + *offset, sizeof(T));
  *offset += sizeof(T);
  return true;
}

bool ReadString(absl::string_view payload, size_t* offset, std::string* s) {
  uint32_t size = 0;
  if (!ReadFixed(payload, offset, &size)) return false;
  if (payload.size() - *offset < size) return false;
  s->assign(payload.data() + *offset, size);
  *offset += size;
  return true;
}

}  // namespace

std::string EncodeNcclMessageKey(const MessageKey& key) {
  std::string out;
  AppendFixed(out, static_cast<uint32_t>(key.job.size()));
  out += key.job;
  AppendFixed(out, static_cast<uint32_t>(key.tensor.size()));
  out += key.tensor;
  AppendFixed(out, key.step);
  AppendFixed(out, static_cast<int32_t>(key.round));
  AppendFixed(out, static_cast<uint8_t>(key.phase));
  return out;
}

absl::StatusOr<std::pair<MessageKey, size_t>> DecodeNcclMessageKey(
    absl::string_view payload) {
  MessageKey key;
  size_t offset = 0;
  int32_t round = 0;
  uint8_t phase = 0;
  if (!ReadString(payload, &offset, &key.job) ||
      !ReadString(payload, &offset, &key.tensor) ||
      !ReadFixed(payload, &offset, &key.step) ||
      !ReadFixed(payload, &offset, &round) ||
      !ReadFixed(payload, &offset, &phase)) {
    return absl::DataLossError(absl::StrCat(
        "NCCL message of ", payload.size(),
        " bytes ends inside its key; expected job, tensor, step, round and "
        "phase first"));
  }
  if (phase < static_cast<uint8_t>(Phase::kGather) ||
      phase > static_cast<uint8_t>(Phase::kNeighbours)) {
    return absl::DataLossError(absl::StrCat("NCCL message for tensor '",
                                            key.tensor, "' has phase ",
                                            int{phase}, ", expected 1..6"));
  }
  key.round = round;
  key.phase = static_cast<Phase>(phase);
  return std::make_pair(std::move(key), offset);
}

absl::StatusOr<std::unique_ptr<NcclTransport>> NcclTransport::Create(
    const Options& options, Receiver* receiver) {
  GC_ASSIGN_OR_RETURN(
      std::unique_ptr<NcclExchange> exchange,
      NcclExchange::Create(options.unique_id, options.world_size, options.rank,
                           options.device, options.peer_timeout));
  return std::unique_ptr<NcclTransport>(
      new NcclTransport(options, receiver, std::move(exchange)));
}

NcclTransport::NcclTransport(const Options& options, Receiver* receiver,
                             std::unique_ptr<NcclExchange> exchange)
    : options_(options),
      receiver_(receiver),
      exchange_(std::move(exchange)),
      queues_(options.world_size) {
  for (int r = 0; r < options_.world_size; ++r) {
    if (r != options_.rank) peers_.push_back(r);
  }
  progress_ = std::thread([this] { Progress(); });
}

NcclTransport::~NcclTransport() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  progress_.join();
}

std::string NcclTransport::PeerName(int rank) const {
  return absl::StrCat("rank ", rank, " (NCCL)");
}

absl::Status NcclTransport::SendMessage(int to, const MessageKey& key,
                                        OutgoingMessage message,
                                        absl::Time deadline) {
  if (to < 0 || to >= options_.world_size || to == options_.rank) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", options_.rank, " sends to rank ", to,
        " over NCCL, expected another rank in [0, ", options_.world_size, ")"));
  }
  auto queued = std::make_unique<Queued>();
  queued->key = EncodeNcclMessageKey(key);
  queued->message = std::move(message);
  queued->deadline = deadline;

  absl::MutexLock lock(&mu_);
  auto room = [this, to]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !broken_.ok() || stopping_ ||
           queues_[to].size() < options_.queue_limit;
  };
  mu_.AwaitWithDeadline(absl::Condition(&room), deadline);
  if (!broken_.ok()) {
    return absl::UnavailableError(
        absl::StrCat(PeerName(to), " is unreachable: ", broken_.message()));
  }
  if (stopping_) {
    return absl::CancelledError(
        absl::StrCat("rank ", options_.rank,
                     "'s NCCL transport is shutting down; "
                     "message for ",
                     PeerName(to), " not sent"));
  }
  if (queues_[to].size() >= options_.queue_limit) {
    return absl::DeadlineExceededError(
        absl::StrCat("queue for ", PeerName(to), " stayed full (",
                     options_.queue_limit, " messages) until the deadline"));
  }
  queues_[to].push_back(std::move(queued));
  return absl::OkStatus();
}

std::vector<std::unique_ptr<NcclTransport::Queued>> NcclTransport::TakeHeads() {
  std::vector<std::unique_ptr<Queued>> heads(peers_.size());
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < peers_.size(); ++i) {
    auto& queue = queues_[peers_[i]];
    // Past its deadline a message is dropped: the receiver sees it missing.
    while (!queue.empty() && queue.front()->deadline < now) queue.pop_front();
    if (queue.empty()) continue;
    heads[i] = std::move(queue.front());
    queue.pop_front();
  }
  return heads;
}

void NcclTransport::Progress() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
    }
    std::vector<std::unique_ptr<Queued>> heads = TakeHeads();
    std::vector<NcclExchange::Outgoing> out(peers_.size());
    bool moved = false;
    for (size_t i = 0; i < heads.size(); ++i) {
      if (heads[i] == nullptr) continue;
      out[i].present = true;
      out[i].parts.push_back(heads[i]->key);
      for (absl::string_view part : heads[i]->message.parts) {
        out[i].parts.push_back(part);
      }
      moved = true;
    }
    absl::StatusOr<std::vector<std::optional<codecs::Bytes>>> in =
        exchange_->Run(peers_, out, absl::Now() + options_.peer_timeout);
    if (!in.ok()) {
      Fail(in.status());
      return;
    }
    for (size_t i = 0; i < in->size(); ++i) {
      if (!(*in)[i].has_value()) continue;
      moved = true;
      absl::StatusOr<std::pair<MessageKey, size_t>> key =
          DecodeNcclMessageKey(*(*in)[i]);
      if (!key.ok()) {
        Fail(absl::Status(key.status().code(),
                          absl::StrCat("from ", PeerName(peers_[i]), ": ",
                                       key.status().message())));
        return;
      }
      receiver_->OnMessage(peers_[i], key->first,
                           (*in)[i]->substr(key->second));
    }
    if (!moved) absl::SleepFor(options_.idle_pause);
  }
}

void NcclTransport::Fail(const absl::Status& why) {
  {
    absl::MutexLock lock(&mu_);
    broken_ = absl::Status(
        why.code(),
        absl::StrCat("rank ", options_.rank,
                     "'s NCCL communicator was aborted: ", why.message()));
    for (auto& queue : queues_) queue.clear();
  }
  // One communicator carries every peer, so all of them are gone with it.
  for (int peer : peers_) {
    receiver_->OnPeerLost(
        peer, absl::UnavailableError(absl::StrCat(
                  PeerName(peer), " is unreachable: rank ", options_.rank,
                  "'s NCCL communicator was aborted: ", why.message())));
  }
}

}  // namespace gradcomp::service
