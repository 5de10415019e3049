// CRC-32C (Castagnoli, the checksum of iSCSI, ext4 and gRPC's own framing
// options): what daemons put beside every payload chunk they send each
// other, so that a byte changed between two ranks fails the step instead of
// the average. Uses the SSE4.2 crc32 instruction when the CPU has it
// (checked at run time; no -msse4.2 needed) and a table otherwise; both give
// the same values.
//
//   uint32_t crc = Crc32c(payload);
//   crc = Crc32cExtend(crc, more.data(), more.size());  // == Crc32c(payload +
//   more)
#ifndef GRADCOMP_BASE_CRC32C_H_
#define GRADCOMP_BASE_CRC32C_H_

#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"

namespace gradcomp {

// The CRC-32C of `data` followed by `n` more bytes, given `crc`, the CRC-32C
// of `data` (0 for none).
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n);

inline uint32_t Crc32c(absl::string_view bytes) {
  return Crc32cExtend(0, bytes.data(), bytes.size());
}

// Whether Crc32cExtend uses the CPU's crc32 instruction.
bool Crc32cUsesHardware();

namespace crc32c_internal {
// The two implementations behind Crc32cExtend, for tests and benchmarks.
// ExtendHardware may only be called when Crc32cUsesHardware().
uint32_t ExtendPortable(uint32_t crc, const void* data, size_t n);
uint32_t ExtendHardware(uint32_t crc, const void* data, size_t n);
}  // namespace crc32c_internal

}  // namespace gradcomp

#endif  // GRADCOMP_BASE_CRC32C_H_
