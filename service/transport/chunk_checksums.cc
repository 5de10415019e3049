#include "service/transport/chunk_checksums.h"

#include "base/crc32c.h"

namespace gradcomp::service {

uint32_t ChunkChecksums::Of(size_t index,
                            absl::Span<const absl::string_view> pieces) {
  // Held while computing: the writers of one message to different peers run
  // side by side, and one that waits here would otherwise compute the same
  // chunk at the same time. A chunk (at most 1 MiB) takes ~50 us.
  absl::MutexLock lock(&mu_);
  if (index >= crcs_.size()) crcs_.resize(index + 1);
  if (!crcs_[index].has_value()) {
    uint32_t crc = 0;
    for (absl::string_view piece : pieces) {
      crc = Crc32cExtend(crc, piece.data(), piece.size());
    }
    crcs_[index] = crc;
  }
  return *crcs_[index];
}

}  // namespace gradcomp::service
