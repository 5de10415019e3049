#include "codecs/builtin.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "codecs/cpu/atomo.h"
#include "codecs/cpu/dense.h"
#include "codecs/cpu/int8.h"
#include "codecs/cpu/onebit.h"
#include "codecs/cpu/polar.h"
#include "codecs/cpu/powersgd.h"
#include "codecs/cpu/qsgd.h"
#include "codecs/cpu/randomk.h"
#include "codecs/cpu/sign.h"
#include "codecs/cpu/terngrad.h"
#include "codecs/cpu/threshold.h"
#include "codecs/cpu/topk.h"

namespace gradcomp::codecs {
namespace {

CodecRegistry MakeBuiltinCodecs() {
  CodecRegistry registry;
  // Each codec family registers itself; a failure is a programming error
  // (two codecs with one name), so it stops the process at start-up.
  for (const absl::Status& status :
       {RegisterDenseCodecs(registry), RegisterTopK(registry),
        RegisterQsgd(registry), RegisterRandomK(registry),
        RegisterThreshold(registry), RegisterTernGrad(registry),
        RegisterInt8(registry), RegisterSignCodecs(registry),
        RegisterOneBit(registry), RegisterPowerSgd(registry),
        RegisterAtomo(registry), RegisterPolar(registry)}) {
    if (!status.ok()) {
      std::fprintf(stderr, "gradcomp: registering built-in codecs: %s\n",
                   std::string(status.message()).c_str());
      std::abort();
    }
  }
  return registry;
}

}  // namespace

const CodecRegistry& BuiltinCodecs() {
  static const CodecRegistry* const registry =
      new CodecRegistry(MakeBuiltinCodecs());
  return *registry;
}

}  // namespace gradcomp::codecs
