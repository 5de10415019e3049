#include "service/transport/nccl_transport_testing.h"

#include <string>

#include "base/status_macros.h"
#include "gtest/gtest.h"
#include "service/transport/nccl_transport_exchange.h"

namespace gradcomp::service {

void FailingReceiver::OnMessage(int from, const MessageKey& /*key*/,
                                codecs::Bytes /*payload*/) {
  ADD_FAILURE() << "unexpected message from rank " << from;
}

void FailingReceiver::OnPeerLost(int rank, const absl::Status& why) {
  ADD_FAILURE() << "unexpected loss of rank " << rank << ": " << why;
}

void FailingReceiver::OnCorruptMessage(int from, const MessageKey& /*key*/,
                                       const absl::Status& why) {
  ADD_FAILURE() << "unexpected corrupt message from " << from << ": " << why;
}

absl::StatusOr<std::unique_ptr<NcclTransport>> CreateOneRankNcclTransport(
    Receiver* receiver) {
  GC_ASSIGN_OR_RETURN(const std::string id, NewNcclUniqueId());
  NcclTransport::Options options;
  options.unique_id = id;
  return NcclTransport::Create(options, receiver);
}

}  // namespace gradcomp::service
