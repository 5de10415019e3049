// A codecs/random.h PhiloxStream as the words the kernels take
// (kernels.h PhiloxWords), so that a kernel draws the stream's numbers.
//
//   LaunchQsgdEncode(..., ToPhiloxWords(WorkerStream(ctx, 0)), ...);
#ifndef GRADCOMP_CODECS_CUDA_PHILOX_WORDS_H_
#define GRADCOMP_CODECS_CUDA_PHILOX_WORDS_H_

#include <cstring>

#include "codecs/cuda/kernels.h"
#include "codecs/random.h"

namespace gradcomp::codecs::cuda {

inline PhiloxWords ToPhiloxWords(const PhiloxStream& stream) {
  const PhiloxStream::Words w = stream.GetWords();
  PhiloxWords out;
  static_assert(sizeof(out.counter_tail) == sizeof(w.counter_tail) &&
                    sizeof(out.key) == sizeof(w.key),
                "PhiloxWords mirrors PhiloxStream::Words");
  std::memcpy(out.counter_tail, w.counter_tail, sizeof(out.counter_tail));
  std::memcpy(out.key, w.key, sizeof(out.key));
  return out;
}

}  // namespace gradcomp::codecs::cuda

#endif  // GRADCOMP_CODECS_CUDA_PHILOX_WORDS_H_
