// Checks for codecs that override SingleRoundCodec::FinishGather to decode
// straight into the output: good payloads must give the default's average
// bit for bit, and a bad payload the default's error with the output left
// as it was.
//
//   std::vector<float> mean = ExpectGatherMatchesTheDefault(*codec, good, n);
//   ExpectGatherRefusedLikeTheDefault(*codec, {good[0], bad}, n,
//                                     "qsgd: payload of rank 1: ");
#ifndef GRADCOMP_CODECS_TESTING_GATHER_CHECKS_H_
#define GRADCOMP_CODECS_TESTING_GATHER_CHECKS_H_

#include <cstddef>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "codecs/codec.h"
#include "codecs/tensor.h"

namespace gradcomp::codecs::testing {

// Expects codec.FinishGather(payloads) into a `numel`-value output to
// succeed and to write what the default FinishGather writes, bit for bit;
// returns that output.
std::vector<float> ExpectGatherMatchesTheDefault(
    const SingleRoundCodec& codec, absl::Span<const Bytes> payloads,
    size_t numel);

// Expects codec.FinishGather(payloads) into a `numel`-value output to fail
// with InvalidArgument naming `message`, with exactly the status the default
// FinishGather returns, and to leave the output untouched; and the same
// for no payloads at all.
void ExpectGatherRefusedLikeTheDefault(const SingleRoundCodec& codec,
                                       absl::Span<const Bytes> payloads,
                                       size_t numel, absl::string_view message);

}  // namespace gradcomp::codecs::testing

#endif  // GRADCOMP_CODECS_TESTING_GATHER_CHECKS_H_
