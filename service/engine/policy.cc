#include "service/engine/policy.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/fnv1a.h"
#include "codecs/params.h"
#include "service/engine/glob.h"

namespace gradcomp::service {
namespace {

bool RuleMatches(const PolicyRule& rule, const TensorFacts& t) {
  if (!GlobMatch(rule.name_glob, t.name)) return false;
  if (t.numel < rule.min_numel) return false;
  if (rule.max_numel != 0 && t.numel > rule.max_numel) return false;
  if (t.ndim < rule.min_ndim) return false;
  if (rule.max_ndim != 0 && t.ndim > rule.max_ndim) return false;
  return rule.dtype == DType::kUnspecified || rule.dtype == t.dtype;
}

PolicyDecision Dense(std::string reason) {
  return {CodecSpec{std::string(kDenseCodec), {}}, std::move(reason)};
}

// The policy's choice of `spec`, whose own warm-up starts once the
// policy's dense warm-up is over.
PolicyDecision FromSpec(const Policy& policy, const CodecSpec& spec,
                        absl::string_view reason, Aggregation aggregation) {
  return {
      spec, spec.name == kDenseCodec ? std::string(reason) : "", aggregation,
      static_cast<int64_t>(std::min<uint64_t>(policy.warmup_steps, INT64_MAX))};
}

std::string RuleLabel(size_t index, const PolicyRule& rule) {
  return absl::StrCat("policy rule ", index, " (name_glob '", rule.name_glob,
                      "')");
}

// Feeds the policy, field by field, into FNV-1a (base/fnv1a.h). Strings are
// length-prefixed and integers fixed-width, so distinct policies serialise
// differently.
class Fnv64 {
 public:
  void Bytes(const void* data, size_t size) {
    hash_.Update(absl::string_view(static_cast<const char*>(data), size));
  }
  void U64(uint64_t v) {
    unsigned char le[8];
    for (int i = 0; i < 8; ++i)
      le[i] = static_cast<unsigned char>(v >> (8 * i));
    Bytes(le, sizeof(le));
  }
  void Str(absl::string_view s) {
    U64(s.size());
    Bytes(s.data(), s.size());
  }
  void Spec(const CodecSpec& spec) {
    Str(spec.name);
    U64(spec.params.size());
    for (const auto& [key, value] : spec.params) {
      Str(key);
      Str(value);
    }
  }
  uint64_t value() const { return hash_.value(); }

 private:
  Fnv1a64 hash_;
};

}  // namespace

PolicyDecision Decide(const Policy& policy, const TensorFacts& tensor) {
  if (tensor.step >= 0 &&
      static_cast<uint64_t>(tensor.step) < policy.warmup_steps) {
    return Dense("warmup");
  }
  if (tensor.numel < policy.dense_below_numel) return Dense("small");
  if (policy.dense_1d && tensor.ndim == 1) return Dense("1-d");
  for (const PolicyRule& rule : policy.rules) {
    if (RuleMatches(rule, tensor)) {
      return FromSpec(policy, rule.codec, "rule",
                      rule.aggregation.value_or(policy.aggregation));
    }
  }
  return FromSpec(policy, policy.default_codec, "default", policy.aggregation);
}

absl::StatusOr<std::unique_ptr<codecs::Codec>> CreateCodec(
    const codecs::CodecRegistry& registry, const CodecSpec& spec) {
  absl::StatusOr<std::unique_ptr<codecs::Codec>> codec =
      registry.Create(spec.name, codecs::CodecParams(spec.params));
  if (codec.status().code() == absl::StatusCode::kNotFound) {
    return absl::InvalidArgumentError(codec.status().message());
  }
  return codec;
}

absl::Status ValidatePolicy(const Policy& policy,
                            const codecs::CodecRegistry& registry) {
  for (size_t i = 0; i < policy.rules.size(); ++i) {
    const PolicyRule& rule = policy.rules[i];
    if (rule.name_glob.find('[') != std::string::npos) {
      // fnmatch would read "layer[0-3].*" as a class; here it would match
      // only a literal '[', silently no tensor at all.
      return absl::InvalidArgumentError(absl::StrCat(
          RuleLabel(i, rule),
          ": '[' starts a character class, which name_glob does not "
          "support; expected only * (any run of characters) and ? (one "
          "character)"));
    }
    if (rule.max_numel != 0 && rule.min_numel > rule.max_numel) {
      return absl::InvalidArgumentError(absl::StrCat(
          RuleLabel(i, rule), ": min_numel ", rule.min_numel,
          " is above max_numel ", rule.max_numel, " (0 means no bound)"));
    }
    if (rule.max_ndim != 0 && rule.min_ndim > rule.max_ndim) {
      return absl::InvalidArgumentError(absl::StrCat(
          RuleLabel(i, rule), ": min_ndim ", rule.min_ndim,
          " is above max_ndim ", rule.max_ndim, " (0 means no bound)"));
    }
    if (rule.dtype != DType::kUnspecified && !DTypeBytes(rule.dtype).ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          RuleLabel(i, rule), ": ", DTypeBytes(rule.dtype).status().message()));
    }
    if (rule.codec.name.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(RuleLabel(i, rule),
                       ": codec name is empty, expected a codec such as \"",
                       kDenseCodec, "\""));
    }
    absl::Status created = CreateCodec(registry, rule.codec).status();
    if (!created.ok()) {
      return absl::Status(created.code(), absl::StrCat(RuleLabel(i, rule), ": ",
                                                       created.message()));
    }
  }
  absl::Status created = CreateCodec(registry, policy.default_codec).status();
  if (!created.ok()) {
    return absl::Status(created.code(), absl::StrCat("policy default_codec: ",
                                                     created.message()));
  }
  return absl::OkStatus();
}

std::string PolicyHash(const Policy& policy) {
  Fnv64 h;
  h.U64(policy.rules.size());
  for (const PolicyRule& rule : policy.rules) {
    h.Str(rule.name_glob);
    h.U64(rule.min_numel);
    h.U64(rule.max_numel);
    h.U64(rule.min_ndim);
    h.U64(rule.max_ndim);
    h.U64(static_cast<uint64_t>(rule.dtype));
    h.Spec(rule.codec);
  }
  h.U64(policy.dense_below_numel);
  h.U64(policy.dense_1d ? 1 : 0);
  h.U64(policy.warmup_steps);
  h.Spec(policy.default_codec);
  // Aggregation settings are fed only where they differ from the defaults,
  // so that the hashes of policies that set none stay what they were.
  for (size_t i = 0; i < policy.rules.size(); ++i) {
    if (!policy.rules[i].aggregation.has_value()) continue;
    h.U64(i);
    h.U64(static_cast<uint64_t>(*policy.rules[i].aggregation) + 1);
  }
  if (policy.aggregation != Aggregation::kAllgather) {
    h.U64(policy.rules.size());
    h.U64(static_cast<uint64_t>(policy.aggregation) + 1);
  }
  return absl::StrFormat("%016x", h.value());
}

}  // namespace gradcomp::service
