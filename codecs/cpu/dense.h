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

#include "absl/status/status.h"
#include "codecs/registry.h"

namespace gradcomp::codecs {

absl::Status RegisterDenseCodecs(CodecRegistry& registry);

}  // namespace gradcomp::codecs

#endif  // GRADCOMP_CODECS_CPU_DENSE_H_
