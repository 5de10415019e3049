#include "base/utf8.h"

namespace gradcomp {

size_t Utf8SequenceBytes(absl::string_view text, size_t i) {
  const auto c = static_cast<unsigned char>(text[i]);
  if (c < 0x80) return 1;
  size_t bytes = 0;
  unsigned char low = 0x80, high = 0xBF;  // range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    bytes = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    bytes = 3;
    if (c == 0xE0) low = 0xA0;   // overlong
    if (c == 0xED) high = 0x9F;  // surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    bytes = 4;
    if (c == 0xF0) low = 0x90;   // overlong
    if (c == 0xF4) high = 0x8F;  // above U+10FFFF
  } else {
    return 0;  // a continuation byte, C0/C1 (overlong) or F5..FF
  }
  if (text.size() - i < bytes) return 0;
  for (size_t k = 1; k < bytes; ++k) {
    const auto b = static_cast<unsigned char>(text[i + k]);
    if (k == 1 ? (b < low || b > high) : (b >> 6) != 0x2) return 0;
  }
  return bytes;
}

size_t FirstInvalidUtf8Byte(absl::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const size_t bytes = Utf8SequenceBytes(text, i);
    if (bytes == 0) return i;
    i += bytes;
  }
  return text.size();
}

}  // namespace gradcomp
