// Checks for codecs that override SingleRoundCodec::FinishGather to decode
// straight into the output: a bad payload must give the default's error and
// leave the output as it was.
//
//   ExpectGatherRefusedLikeTheDefault(*codec, {good, bad}, 10,
//                                     "qsgd: payload of rank 1: ");
#ifndef GRADCOMP_CODECS_TESTING_GATHER_CHECKS_H_
#define GRADCOMP_CODECS_TESTING_GATHER_CHECKS_H_

#include <cstddef>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "codecs/codec.h"
#include "codecs/tensor.h"

namespace gradcomp::codecs::testing {

// Expects codec.FinishGather(payloads) into a `numel`-value output to fail
// with InvalidArgument naming `message`, with exactly the status the default
// FinishGather returns, and to leave the output untouched; and the same
// for no payloads at all.
void ExpectGatherRefusedLikeTheDefault(const SingleRoundCodec& codec,
                                       absl::Span<const Bytes> payloads,
                                       size_t numel, absl::string_view message);

}  // namespace gradcomp::codecs::testing

#endif  // GRADCOMP_CODECS_TESTING_GATHER_CHECKS_H_
