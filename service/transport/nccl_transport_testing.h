// Set-up shared by the NCCL transport's tests (nccl_transport_test on a GPU,
// nccl_transport_fallback_test everywhere): a receiver that fails the test
// on any call, and a one-rank transport on a fresh unique id.
//
//   FailingReceiver receiver;
//   absl::StatusOr<std::unique_ptr<NcclTransport>> transport =
//       CreateOneRankNcclTransport(&receiver);
#ifndef GRADCOMP_SERVICE_TRANSPORT_NCCL_TRANSPORT_TESTING_H_
#define GRADCOMP_SERVICE_TRANSPORT_NCCL_TRANSPORT_TESTING_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "codecs/tensor.h"
#include "service/transport/nccl_transport.h"
#include "service/transport/transport.h"

namespace gradcomp::service {

// Adds a test failure for every message, loss or corrupt message: for tests
// in which nothing may arrive.
struct FailingReceiver : Receiver {
  void OnMessage(int from, const MessageKey& key,
                 codecs::Bytes payload) override;
  void OnPeerLost(int rank, const absl::Status& why) override;
  void OnCorruptMessage(int from, const MessageKey& key,
                        const absl::Status& why) override;
};

// NcclTransport::Create for rank 0 of a world of 1, on a new unique id
// (NewNcclUniqueId's error if that fails).
absl::StatusOr<std::unique_ptr<NcclTransport>> CreateOneRankNcclTransport(
    Receiver* receiver);

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_TRANSPORT_NCCL_TRANSPORT_TESTING_H_
