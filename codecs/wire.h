// The versioned wire format shared by every codec (docs/wire-format.md).
//
// A payload is a 32-byte little-endian header, then a codec-specific
// parameter block, then the body:
//
//   offset  size  field
//        0     4  magic "GCMP"
//        4     1  format version (kWireVersion)
//        5     1  codec id (CodecId)
//        6     1  round index within the step
//        7     1  flags (kFlagDenseBody; other bits must be 0)
//        8     8  element count of the tensor (numel)
//       16     4  parameter block length P
//       20     4  reserved, 0
//       24     8  body length B
//       32     P  parameters
//     32+P     B  body
//
// The payload's length must be exactly 32 + P + B. With kFlagDenseBody the
// first parameter byte is an ElemType and the body is a dense vector of that
// type (any length), which is what lets a collective sum payloads without
// knowing the codec.
#ifndef GRADCOMP_CODECS_WIRE_H_
#define GRADCOMP_CODECS_WIRE_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "codecs/tensor.h"

namespace gradcomp::codecs {

inline constexpr uint32_t kWireMagic = 0x504D4347;  // "GCMP" little-endian
inline constexpr uint8_t kWireVersion = 1;
inline constexpr size_t kWireHeaderBytes = 32;
inline constexpr uint8_t kFlagDenseBody = 0x01;

// Stable on the wire: never renumber, only append.
enum class CodecId : uint8_t {
  kNone = 1,
  kFp16 = 2,
  kBf16 = 3,
  kTopK = 4,
  kQsgd = 5,
  kRandomK = 6,
  kThreshold = 7,
  kTernGrad = 8,
  kInt8 = 9,
  kSignSgd = 10,
  kEfSign = 11,
  kSignum = 12,
  kOneBit = 13,
  kPowerSgd = 14,
  kAtomo = 15,
  kPolar = 16,
};

// Element type of a dense body.
enum class ElemType : uint8_t { kF32 = 1, kF16 = 2, kBF16 = 3 };

size_t ElemTypeBytes(ElemType t);

struct WireHeader {
  CodecId codec = CodecId::kNone;
  uint8_t round = 0;
  uint8_t flags = 0;
  uint64_t numel = 0;
};

// A parsed, validated payload: views into the original bytes.
struct ParsedPayload {
  WireHeader header;
  absl::string_view params;
  absl::string_view body;
};

// Appends header + params + body to an empty `out`.
void WritePayload(const WireHeader& header, absl::string_view params,
                  absl::string_view body, Bytes* out);

// Starts a payload whose body the caller writes in place: `out` is resized to
// header + params + body_bytes and the returned pointer is the body's start.
char* BeginPayload(const WireHeader& header, absl::string_view params,
                   size_t body_bytes, Bytes* out);

// Starts a payload whose body the caller appends rather than writes in place:
// `out` holds header + params and has room for body_bytes more, which the
// caller must append (AppendDenseValues, or append()). For bodies copied or
// converted from other memory, this skips the zero fill that BeginPayload's
// resize does before they are written over it (a tensor-sized memset).
void BeginPayloadForAppend(const WireHeader& header, absl::string_view params,
                           size_t body_bytes, Bytes* out);

// The header and parameter block of a payload whose body of `body_bytes` is
// kept elsewhere: followed by that body, it is the payload WritePayload
// writes. For senders that send a slice of a body without copying it.
Bytes PayloadHead(const WireHeader& header, absl::string_view params,
                  size_t body_bytes);

// Checks magic, version, flags, lengths, and that codec, round and numel are
// the expected ones. Errors are InvalidArgument and say what was expected.
absl::StatusOr<ParsedPayload> ParsePayload(absl::string_view payload,
                                           CodecId codec, uint8_t round,
                                           uint64_t numel);

// Reads only the header (for dispatch and diagnostics), with the same
// structural checks as ParsePayload but no expectations.
absl::StatusOr<ParsedPayload> PeekPayload(absl::string_view payload);

// Asks the kernel to back a large, untouched buffer with transparent huge
// pages (Linux; elsewhere a no-op). First-touch page faults dominate filling
// a fresh multi-megabyte payload, and on virtual machines 4 KiB faults cost
// ~10 us each: a 50 MB payload goes from ~140 ms to ~8 ms. Call it after
// reserve() and before the buffer is written.
void AdviseHugePages(void* data, size_t bytes);

// Writes a dense-body payload of `values` converted to `type`; the header's
// numel stays the caller's (the tensor's), and kFlagDenseBody is set.
void WriteDensePayload(const WireHeader& header, ElemType type,
                       absl::Span<const float> values, Bytes* out);

// Appends `values` times `scale`, converted to `type`, to `out` (fp32 copied
// as they are when `scale` is 1). Converted values go through a small
// buffer, so the payload's memory is written once.
void AppendDenseValues(ElemType type, absl::Span<const float> values,
                       float scale, Bytes* out);

// For a kFlagDenseBody payload: the number of elements its body holds
// (InvalidArgument if it has no dense body, an unknown element type, or a
// body that is not a whole number of elements). A kSum collective sizes its
// accumulator with it: the body may be shorter than the tensor.
absl::StatusOr<size_t> DenseBodyElements(const ParsedPayload& payload);

// For a kFlagDenseBody payload: acc += alpha * body. The body must hold
// exactly acc.size() elements (which may differ from the header's numel:
// random-k sends k values of an n-element tensor).
absl::Status AddDenseBody(const ParsedPayload& payload, float alpha,
                          absl::Span<float> acc);

}  // namespace gradcomp::codecs

#endif  // GRADCOMP_CODECS_WIRE_H_
