#include "codecs/params.h"

#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace gradcomp::codecs {
namespace {

absl::Status BadValue(absl::string_view key, absl::string_view text,
                      absl::string_view expected) {
  return absl::InvalidArgumentError(absl::StrFormat(
      "parameter '%s': expected %s, got '%s'", key, expected, text));
}

}  // namespace

absl::StatusOr<double> CodecParams::GetDouble(absl::string_view key,
                                              double fallback) const {
  asked_.emplace(key);
  auto it = values_.find(std::string(key));
  if (it == values_.end()) return fallback;
  double v;
  if (!absl::SimpleAtod(it->second, &v)) {
    return BadValue(key, it->second, "a number");
  }
  return v;
}

absl::StatusOr<int64_t> CodecParams::GetInt(absl::string_view key,
                                            int64_t fallback) const {
  asked_.emplace(key);
  auto it = values_.find(std::string(key));
  if (it == values_.end()) return fallback;
  int64_t v;
  if (!absl::SimpleAtoi(it->second, &v)) {
    return BadValue(key, it->second, "an integer");
  }
  return v;
}

absl::StatusOr<bool> CodecParams::GetBool(absl::string_view key,
                                          bool fallback) const {
  asked_.emplace(key);
  auto it = values_.find(std::string(key));
  if (it == values_.end()) return fallback;
  bool v;
  if (!absl::SimpleAtob(it->second, &v)) {
    return BadValue(key, it->second, "true/false, yes/no, on/off or 1/0");
  }
  return v;
}

absl::StatusOr<std::string> CodecParams::GetString(
    absl::string_view key, absl::string_view fallback) const {
  asked_.emplace(key);
  auto it = values_.find(std::string(key));
  if (it == values_.end()) return std::string(fallback);
  return it->second;
}

absl::Status CodecParams::CheckAllUsed(absl::string_view codec) const {
  std::vector<std::string> unknown;
  for (const auto& [key, value] : values_) {
    if (asked_.find(key) == asked_.end()) unknown.push_back("'" + key + "'");
  }
  if (unknown.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "unknown parameter%s %s for codec '%s' (accepted: %s)",
      unknown.size() > 1 ? "s" : "", absl::StrJoin(unknown, ", "), codec,
      asked_.empty() ? "none" : absl::StrJoin(asked_, ", ")));
}

absl::Status CheckRange(absl::string_view codec, absl::string_view name,
                        int64_t value, int64_t lo, int64_t hi) {
  if (value < lo || value > hi) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: %s must be in [%d, %d]; got %d", codec, name, lo, hi, value));
  }
  return absl::OkStatus();
}

}  // namespace gradcomp::codecs
