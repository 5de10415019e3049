// The dense codecs: `none` (fp32), `fp16` and `bf16`. Each sends every value,
// is summable (any allreduce adds the bodies in fp32) and takes one parameter,
// `prescale` (bool, default false): divide by the world size before the cast
// so that the sum of W half-precision values cannot overflow.
//
//   CodecRegistry registry;
//   GC_RETURN_IF_ERROR(RegisterDenseCodecs(registry));
//   GC_ASSIGN_OR_RETURN(auto codec, registry.Create("fp16", {}));
#ifndef GRADCOMP_CODECS_CPU_DENSE_H_
#define GRADCOMP_CODECS_CPU_DENSE_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "codecs/registry.h"
#include "codecs/wire.h"

namespace gradcomp::codecs {

// A dense payload of `type` (kF32: none, kF16: fp16, kBF16: bf16) for a
// tensor of n elements, checked as DecodeAdd checks it (the GPU decoder,
// codecs/cuda, uses the same checks). Decoding adds alpha * divisor * body.
struct DensePayload {
  uint32_t divisor = 1;    // the prescale divisor, >= 1
  absl::string_view body;  // n elements of `type`, unaligned
};
absl::StatusOr<DensePayload> ParseDensePayload(absl::string_view payload,
                                               ElemType type, size_t n);

absl::Status RegisterDenseCodecs(CodecRegistry& registry);

}  // namespace gradcomp::codecs

#endif  // GRADCOMP_CODECS_CPU_DENSE_H_
