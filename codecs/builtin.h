// The registry of every codec gradcomp ships.
#ifndef GRADCOMP_CODECS_BUILTIN_H_
#define GRADCOMP_CODECS_BUILTIN_H_

#include "codecs/registry.h"

namespace gradcomp::codecs {

// Built once, on first use; immutable afterwards, so safe to share.
const CodecRegistry& BuiltinCodecs();

}  // namespace gradcomp::codecs

#endif  // GRADCOMP_CODECS_BUILTIN_H_
