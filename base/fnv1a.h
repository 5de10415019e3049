// FNV-1a, 64-bit: a stable hash of bytes, the same in every process and on
// every platform, for ids and digests that ranks compare (not for security).
//
//   Fnv1a64 h;
//   h.Update("fc1.weight");
//   uint64_t id = h.value();          // or Fnv1a64::Of("fc1.weight")
#ifndef GRADCOMP_BASE_FNV1A_H_
#define GRADCOMP_BASE_FNV1A_H_

#include <cstdint>

#include "absl/strings/string_view.h"

namespace gradcomp {

class Fnv1a64 {
 public:
  static uint64_t Of(absl::string_view bytes) {
    Fnv1a64 h;
    h.Update(bytes);
    return h.value();
  }

  void Update(absl::string_view bytes) {
    for (char c : bytes) {
      hash_ = (hash_ ^ static_cast<unsigned char>(c)) * 0x100000001b3ULL;
    }
  }
  uint64_t value() const { return hash_; }

 private:
  uint64_t hash_ = 0xcbf29ce484222325ULL;  // the offset basis
};

}  // namespace gradcomp

#endif  // GRADCOMP_BASE_FNV1A_H_
