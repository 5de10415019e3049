#include "service/config/policy_proto.h"

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/status_macros.h"

namespace gradcomp::service {
namespace {

// Unset (UNSPECIFIED) is nullopt; a number this build does not know (a
// newer client's) is refused, naming `field`.
absl::StatusOr<std::optional<Aggregation>> AggregationFromProto(
    v1::Aggregation a, absl::string_view field) {
  switch (a) {
    case v1::AGGREGATION_UNSPECIFIED:
      return std::nullopt;
    case v1::AGGREGATION_ALLGATHER:
      return Aggregation::kAllgather;
    case v1::AGGREGATION_SHARDED:
      return Aggregation::kSharded;
    case v1::AGGREGATION_AUTO:
      return Aggregation::kAuto;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          field, " is ", static_cast<int>(a),
          ", expected AGGREGATION_ALLGATHER (1), AGGREGATION_SHARDED (2) or "
          "AGGREGATION_AUTO (3), or none"));
  }
}

v1::Aggregation AggregationToProto(Aggregation a) {
  switch (a) {
    case Aggregation::kAllgather:
      return v1::AGGREGATION_ALLGATHER;
    case Aggregation::kSharded:
      return v1::AGGREGATION_SHARDED;
    case Aggregation::kAuto:
      return v1::AGGREGATION_AUTO;
  }
  return v1::AGGREGATION_UNSPECIFIED;
}

}  // namespace

CodecSpec CodecSpecFromProto(const v1::CodecSpec& spec) {
  CodecSpec out;
  out.name = spec.name();
  out.params.insert(spec.params().begin(), spec.params().end());
  return out;
}

v1::CodecSpec CodecSpecToProto(const CodecSpec& spec) {
  v1::CodecSpec out;
  out.set_name(spec.name);
  out.mutable_params()->insert(spec.params.begin(), spec.params.end());
  return out;
}

absl::StatusOr<Policy> PolicyFromProto(const v1::Policy& policy) {
  Policy out;
  for (int i = 0; i < policy.rules_size(); ++i) {
    const v1::PolicyRule& rule = policy.rules(i);
    PolicyRule r;
    r.name_glob = rule.name_glob();
    r.min_numel = rule.min_numel();
    r.max_numel = rule.max_numel();
    r.min_ndim = rule.min_ndim();
    r.max_ndim = rule.max_ndim();
    r.dtype = DTypeFromProto(rule.dtype());
    r.codec = CodecSpecFromProto(rule.codec());
    GC_ASSIGN_OR_RETURN(
        r.aggregation,
        AggregationFromProto(rule.aggregation(),
                             absl::StrCat("policy rule ", i, " aggregation")));
    out.rules.push_back(std::move(r));
  }
  if (policy.has_dense_below_numel()) {
    out.dense_below_numel = policy.dense_below_numel();
  }
  if (policy.has_dense_1d()) out.dense_1d = policy.dense_1d();
  out.warmup_steps = policy.warmup_steps();
  if (!policy.default_codec().name().empty()) {
    out.default_codec = CodecSpecFromProto(policy.default_codec());
  } else if (!policy.default_codec().params().empty()) {
    // Dropping them would run "none" where the user meant a codec.
    return absl::InvalidArgumentError(absl::StrCat(
        "policy default_codec has params (",
        policy.default_codec().params().begin()->first,
        ", ...) but no name; expected the codec's name with them, or "
        "neither for \"",
        kDenseCodec, "\""));
  }
  GC_ASSIGN_OR_RETURN(
      const std::optional<Aggregation> aggregation,
      AggregationFromProto(policy.aggregation(), "policy aggregation"));
  out.aggregation = aggregation.value_or(Aggregation::kAllgather);
  return out;
}

v1::Policy PolicyToProto(const Policy& policy) {
  v1::Policy out;
  for (const PolicyRule& rule : policy.rules) {
    v1::PolicyRule* r = out.add_rules();
    r->set_name_glob(rule.name_glob);
    r->set_min_numel(rule.min_numel);
    r->set_max_numel(rule.max_numel);
    r->set_min_ndim(rule.min_ndim);
    r->set_max_ndim(rule.max_ndim);
    r->set_dtype(DTypeToProto(rule.dtype));
    *r->mutable_codec() = CodecSpecToProto(rule.codec);
    if (rule.aggregation.has_value()) {
      r->set_aggregation(AggregationToProto(*rule.aggregation));
    }
  }
  out.set_dense_below_numel(policy.dense_below_numel);
  out.set_dense_1d(policy.dense_1d);
  out.set_warmup_steps(policy.warmup_steps);
  *out.mutable_default_codec() = CodecSpecToProto(policy.default_codec);
  out.set_aggregation(AggregationToProto(policy.aggregation));
  return out;
}

}  // namespace gradcomp::service
