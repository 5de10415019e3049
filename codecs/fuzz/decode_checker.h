// The property every decoder fuzz target checks: whatever bytes arrive as a
// payload, a codec decodes them or rejects them with InvalidArgument, and a
// rejected payload leaves the caller's buffers as they were.
//
//   GC_ASSIGN_OR_RETURN(DecodeChecker checker, DecodeChecker::Create("topk"));
//   absl::Status s = checker.Check(payload);  // Internal: a contract broke
//
// Crashes and out-of-bounds reads are the sanitizers' to report; Check()
// reports what they cannot see: a wrong status code, a buffer touched by a
// rejected payload, a gather that disagrees with DecodeAdd.
#ifndef GRADCOMP_CODECS_FUZZ_DECODE_CHECKER_H_
#define GRADCOMP_CODECS_FUZZ_DECODE_CHECKER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "codecs/codec.h"
#include "codecs/wire.h"

namespace gradcomp::codecs::fuzz {

// Payloads claiming more elements are skipped. A decoder accepts only the
// numel of the accumulator its caller allocated, so a larger claim reaches
// no decoding code; checking it would cost an allocation per input and slow
// the fuzzer several times over.
inline constexpr uint64_t kMaxDecodeNumel = uint64_t{1} << 16;

// Payloads claiming more elements skip the session check, which encodes a
// tensor of that size on every input.
inline constexpr uint64_t kMaxSessionNumel = 1024;

class DecodeChecker {
 public:
  // The codec `name` of BuiltinCodecs() with its default parameters and with
  // the parameters of each of its golden cases (codecs/testing/golden.h),
  // which cover the variants whose decoding or finishing differs (error
  // feedback, prescaled sums, majority vote).
  static absl::StatusOr<DecodeChecker> Create(absl::string_view name);

  // OK when every variant honoured its contract on `payload`, whether it
  // accepted it or not; Internal naming the variant and the broken promise
  // otherwise.
  absl::Status Check(absl::string_view payload) const;

  const std::string& name() const { return name_; }

 private:
  struct Variant {
    std::string label;  // "default" or the golden case's file name
    std::unique_ptr<Codec> codec;
  };

  DecodeChecker(std::string name, std::vector<Variant> variants)
      : name_(std::move(name)), variants_(std::move(variants)) {}

  std::string name_;
  std::vector<Variant> variants_;
};

}  // namespace gradcomp::codecs::fuzz

#endif  // GRADCOMP_CODECS_FUZZ_DECODE_CHECKER_H_
