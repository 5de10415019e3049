#include "service/collective/gather_batch_message.h"

#include "absl/strings/str_cat.h"

namespace gradcomp::service {

codecs::Bytes GatherMessage(const std::vector<codecs::Bytes>& payloads,
                            const std::vector<bool>& arrived) {
  size_t total = 0;
  for (size_t i = 0; i < payloads.size(); ++i) {
    total += kGatherEntryHeader + (arrived[i] ? payloads[i].size() : 0);
  }
  codecs::Bytes message;
  message.reserve(total);
  for (size_t i = 0; i < payloads.size(); ++i) {
    const uint64_t size = arrived[i] ? payloads[i].size() : 0;
    char entry[kGatherEntryHeader];
    entry[0] = arrived[i] ? 1 : 0;
    for (size_t b = 0; b < sizeof(size); ++b) {
      entry[1 + b] = static_cast<char>((size >> (8 * b)) & 0xff);
    }
    message.append(entry, sizeof(entry));
    if (arrived[i]) message.append(payloads[i]);
  }
  return message;
}

absl::Status SplitGatherMessage(
    const codecs::Bytes& message, int rank,
    std::vector<std::optional<codecs::Bytes>>* out) {
  size_t at = 0;
  for (size_t i = 0; i < out->size(); ++i) {
    if (message.size() - at < kGatherEntryHeader) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", rank, "'s batch message ends at member ", i,
                       " of ", out->size(), " (", message.size(), " bytes)"));
    }
    const uint8_t present = static_cast<uint8_t>(message[at]);
    uint64_t size = 0;
    for (size_t b = 0; b < sizeof(size); ++b) {
      size |= uint64_t{static_cast<uint8_t>(message[at + 1 + b])} << (8 * b);
    }
    at += kGatherEntryHeader;
    // Compared with what is left, not added to `at`: a length near 2^64
    // must not wrap around.
    if (present > 1 || (present == 0 && size != 0) ||
        size > message.size() - at) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", rank, "'s batch message has a bad entry for member ", i,
          ": presence ", present, ", ", size, " bytes, ", message.size() - at,
          " left"));
    }
    if (present == 1) (*out)[i] = message.substr(at, size);
    at += size;
  }
  if (at != message.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank, "'s batch message has ", message.size() - at,
        " bytes after its ", out->size(), " members"));
  }
  return absl::OkStatus();
}

}  // namespace gradcomp::service
