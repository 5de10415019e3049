// The per-tensor codec policy: which codec (and parameters) compresses a
// tensor, or why it goes dense. Core types only; service/config converts
// the gradcomp.v1.Policy proto to and from these.
//
//   Policy policy;  // defaults: dense below 1024 elements, 1-D dense
//   PolicyRule rule;
//   rule.name_glob = "*.weight";
//   rule.codec = {"topk", {{"ratio", "0.01"}}};
//   policy.rules.push_back(rule);
//   PolicyDecision d = Decide(policy, {"fc1.weight", 4096, 2, DType::kFloat32,
//   7});
#ifndef GRADCOMP_SERVICE_ENGINE_POLICY_H_
#define GRADCOMP_SERVICE_ENGINE_POLICY_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "codecs/codec.h"
#include "codecs/registry.h"
#include "service/collective/sharded_reduce.h"
#include "service/engine/dtype.h"

namespace gradcomp::service {

// The codec that sends a tensor uncompressed, in fp32.
inline constexpr absl::string_view kDenseCodec = "none";

struct CodecSpec {
  std::string name;
  std::map<std::string, std::string> params;

  bool operator==(const CodecSpec& o) const {
    return name == o.name && params == o.params;
  }
};

// A rule matches when every set matcher matches; 0 / empty / kUnspecified
// mean "any".
struct PolicyRule {
  std::string name_glob;
  uint64_t min_numel = 0;
  uint64_t max_numel = 0;
  uint32_t min_ndim = 0;
  uint32_t max_ndim = 0;
  DType dtype = DType::kUnspecified;
  CodecSpec codec;
  // How the codec's GATHER rounds are aggregated; unset: the policy's.
  std::optional<Aggregation> aggregation;
};

struct Policy {
  std::vector<PolicyRule> rules;
  // Tiny tensors gain nothing from compression but pay its latency, and
  // their residuals would dominate error feedback noise.
  uint64_t dense_below_numel = 1024;
  // Biases and norm scales are 1-D: small, and sensitive to compression.
  bool dense_1d = true;
  // The first steps' gradients change fastest; DGC warms up densely.
  uint64_t warmup_steps = 0;
  CodecSpec default_codec{std::string(kDenseCodec), {}};
  // Aggregation of GATHER codecs where a rule sets none (the default codec,
  // requests' codec overrides). Allgather by default: sharded adds a second
  // compression error, which a user should choose knowingly.
  Aggregation aggregation = Aggregation::kAllgather;
};

// What Decide looks at.
struct TensorFacts {
  absl::string_view name;
  uint64_t numel = 0;
  uint32_t ndim = 0;
  DType dtype = DType::kFloat32;
  int64_t step = 0;
};

struct PolicyDecision {
  CodecSpec codec;
  // Why the tensor goes dense: "warmup", "small", "1-d", "rule" (a rule
  // chose "none"), "default" (no rule matched and the default is "none");
  // empty when a compressing codec was chosen. A bounded set: it is a
  // metric label.
  std::string dense_reason;
  Aggregation aggregation = Aggregation::kAllgather;
  // The policy's dense warm-up steps, after which a codec's own warm-up
  // schedule starts (StepContext::warmup_offset); 0 for a request's codec.
  int64_t warmup_offset = 0;
};

// Warm-up, then the size and 1-D defaults, then the rules in order, then
// the default codec: defaults come first so that a catch-all rule such as
// "*" -> topk does not compress biases unless the user turns them off.
PolicyDecision Decide(const Policy& policy, const TensorFacts& tensor);

// Creates `spec`'s codec. An unknown name is InvalidArgument (the caller's
// input is wrong, whatever the registry calls it) listing the known codecs.
absl::StatusOr<std::unique_ptr<codecs::Codec>> CreateCodec(
    const codecs::CodecRegistry& registry, const CodecSpec& spec);

// Checks rule ranges (min <= max) and creates every codec the policy names
// once through `registry`, so that a bad name or parameter fails when the
// policy is loaded, not at the first tensor. Errors name the rule.
absl::Status ValidatePolicy(const Policy& policy,
                            const codecs::CodecRegistry& registry);

// A stable 16-hex-digit digest (64-bit FNV-1a over a deterministic
// serialisation): equal policies hash equal in every process and version,
// so peers can compare policies at their handshake.
std::string PolicyHash(const Policy& policy);

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_ENGINE_POLICY_H_
