// Well-formed UTF-8 (RFC 3629: no overlong forms, no surrogates, nothing
// above U+10FFFF), one character at a time.
//
//   size_t bytes = Utf8SequenceBytes(name, i);  // 0: name[i] starts none
//   if (!IsValidUtf8(text)) ...;
#ifndef GRADCOMP_BASE_UTF8_H_
#define GRADCOMP_BASE_UTF8_H_

#include <cstddef>

#include "absl/strings/string_view.h"

namespace gradcomp {

// Bytes (1 to 4) of the well-formed character that starts at text[i], or 0
// when the bytes there do not form one (a continuation byte, an invalid
// lead, a bad or missing continuation). `i` < text.size().
size_t Utf8SequenceBytes(absl::string_view text, size_t i);

// The offset of the first byte of `text` that is not part of well-formed
// UTF-8, or text.size() when it is all well formed.
size_t FirstInvalidUtf8Byte(absl::string_view text);

inline bool IsValidUtf8(absl::string_view text) {
  return FirstInvalidUtf8Byte(text) == text.size();
}

}  // namespace gradcomp

#endif  // GRADCOMP_BASE_UTF8_H_
