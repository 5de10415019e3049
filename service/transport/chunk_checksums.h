// The CRC-32C of each chunk of one outgoing message, computed by the first
// writer that needs it and reused by the others: a payload sent to W-1 peers
// (an allgather) is checksummed once, not W-1 times. Copies of an
// OutgoingMessage share one ChunkChecksums (transport.h).
//
//   uint32_t crc = message.checksums->Of(chunk_index, chunk_pieces);
#ifndef GRADCOMP_SERVICE_TRANSPORT_CHUNK_CHECKSUMS_H_
#define GRADCOMP_SERVICE_TRANSPORT_CHUNK_CHECKSUMS_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace gradcomp::service {

class ChunkChecksums {
 public:
  // The CRC-32C of chunk `index`, whose bytes are `pieces` in order:
  // computed on the first call for `index`, remembered for the later ones.
  // Every caller must cut the message into the same chunks (one transport,
  // one chunk size). Thread-safe; a caller that arrives while another
  // computes the same chunk waits for it instead of computing it again.
  uint32_t Of(size_t index, absl::Span<const absl::string_view> pieces);

 private:
  absl::Mutex mu_;
  std::vector<std::optional<uint32_t>> crcs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_TRANSPORT_CHUNK_CHECKSUMS_H_
