// UTF-8 checks for the strings of a config. Protobuf's text-format parser
// takes any bytes in a string field, but the JSON printer (--check_config)
// cannot print invalid UTF-8, and an address or a glob made of such bytes
// only fails later, when it is used; so validation refuses them, naming
// the field.
//
//   if (!IsValidUtf8(text)) ...;
//   GC_RETURN_IF_ERROR(CheckStringsAreUtf8(config));
#ifndef GRADCOMP_SERVICE_CONFIG_UTF8_H_
#define GRADCOMP_SERVICE_CONFIG_UTF8_H_

#include <cstddef>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"

namespace gradcomp::service {

// The offset of the first byte of `text` that is not part of well-formed
// UTF-8 (RFC 3629: no overlong forms, no surrogates, nothing above
// U+10FFFF), or text.size() when it is all well formed.
size_t FirstInvalidUtf8Byte(absl::string_view text);

inline bool IsValidUtf8(absl::string_view text) {
  return FirstInvalidUtf8Byte(text) == text.size();
}

// Every string field of `message` and of the messages in it (repeated
// fields and maps included): INVALID_ARGUMENT naming the first that is not
// UTF-8, by its path (`peers[1]`, `policy.rules[0].name_glob`), the byte
// and its offset.
absl::Status CheckStringsAreUtf8(const google::protobuf::Message& message);

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_CONFIG_UTF8_H_
