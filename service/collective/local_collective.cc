#include "service/collective/local_collective.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "codecs/wire.h"

namespace gradcomp::service {

absl::StatusOr<codecs::RoundResult> LocalCollective::Run(const RoundKey& key,
                                                         codecs::Round round) {
  codecs::RoundResult result;
  result.world_size = 1;
  switch (round.collective) {
    case codecs::Collective::kSum: {
      GC_ASSIGN_OR_RETURN(codecs::ParsedPayload parsed,
                          codecs::PeekPayload(round.payload));
      // The body may be shorter than the tensor (PowerSGD's factors,
      // random-k's values): the sum has the body's length.
      absl::StatusOr<size_t> elements = codecs::DenseBodyElements(parsed);
      if (!elements.ok()) {
        return absl::InternalError(absl::StrCat(
            "tensor '", key.tensor, "' step ", key.step, " round ", key.round,
            ": a SUM round's payload has no usable dense body: ",
            elements.status().message()));
      }
      result.sum.assign(*elements, 0.0f);
      GC_RETURN_IF_ERROR(
          codecs::AddDenseBody(parsed, 1.0f, absl::MakeSpan(result.sum)));
      break;
    }
    case codecs::Collective::kGather:
      result.payloads.push_back(std::move(round.payload));
      break;
  }
  return result;
}

absl::StatusOr<std::vector<codecs::Bytes>> LocalCollective::AllToAll(
    const RoundKey& key, std::vector<codecs::Bytes> parts) {
  if (parts.size() != 1) {
    return absl::InternalError(
        absl::StrCat("tensor '", key.tensor, "' step ", key.step, ": ",
                     parts.size(), " parts for an all-to-all, expected 1 ",
                     "(one per rank, world size 1)"));
  }
  return parts;
}

absl::StatusOr<std::vector<codecs::Bytes>> LocalCollective::Allgather(
    const RoundKey& /*key*/, codecs::Bytes part) {
  std::vector<codecs::Bytes> all;
  all.push_back(std::move(part));
  return all;
}

absl::StatusOr<std::vector<codecs::Bytes>>
LocalCollective::ExchangeWithNeighbours(const RoundKey& key,
                                        absl::Span<const int> neighbours,
                                        std::vector<codecs::Bytes> parts) {
  if (!neighbours.empty() || !parts.empty()) {
    return absl::InternalError(absl::StrCat(
        "tensor '", key.tensor, "' step ", key.step, ": a gossip exchange ",
        "with ", neighbours.size(), " neighbours and ", parts.size(),
        " parts at world size 1; expected none"));
  }
  return std::vector<codecs::Bytes>();
}

}  // namespace gradcomp::service
