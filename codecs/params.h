// Codec parameters as they arrive from a policy or a request: strings keyed
// by name, parsed by the codec that takes them.
//
//   GC_ASSIGN_OR_RETURN(double ratio, params.GetDouble("ratio", 0.001));
//   GC_RETURN_IF_ERROR(params.CheckAllUsed("topk"));
#ifndef GRADCOMP_CODECS_PARAMS_H_
#define GRADCOMP_CODECS_PARAMS_H_

#include <cstdint>
#include <initializer_list>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gradcomp::codecs {

// InvalidArgument "<codec>: <name> must be in [lo, hi]; got <value>" unless
// lo <= value <= hi: the one range check every codec's parameters and
// payload headers use.
absl::Status CheckRange(absl::string_view codec, absl::string_view name,
                        int64_t value, int64_t lo, int64_t hi);

class CodecParams {
 public:
  CodecParams() = default;
  explicit CodecParams(std::map<std::string, std::string> values)
      : values_(std::move(values)) {}
  // Makes CodecParams({{"ratio", "0.01"}}) unambiguous: with one pair, the
  // map constructor alone also matches std::map's (first, last) constructor.
  CodecParams(
      std::initializer_list<std::pair<const std::string, std::string>> values)
      : values_(values) {}

  // Each returns `fallback` when the key is absent, and InvalidArgument
  // naming the key and the text when the value does not parse.
  absl::StatusOr<double> GetDouble(absl::string_view key,
                                   double fallback) const;
  absl::StatusOr<int64_t> GetInt(absl::string_view key, int64_t fallback) const;
  absl::StatusOr<bool> GetBool(absl::string_view key, bool fallback) const;
  absl::StatusOr<std::string> GetString(absl::string_view key,
                                        absl::string_view fallback) const;

  // InvalidArgument naming every key no Get* asked for, and the ones that
  // were asked for: "unknown parameter 'ratoi' for codec 'topk' (accepted:
  // momentum, ratio, ...)".
  absl::Status CheckAllUsed(absl::string_view codec) const;

  const std::map<std::string, std::string>& values() const { return values_; }

 private:
  std::map<std::string, std::string> values_;
  mutable std::set<std::string, std::less<>> asked_;
};

}  // namespace gradcomp::codecs

#endif  // GRADCOMP_CODECS_PARAMS_H_
