#include "service/config/policy_proto.h"

#include <string>

namespace gradcomp::service {

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

Policy PolicyFromProto(const v1::Policy& policy) {
  Policy out;
  for (const v1::PolicyRule& rule : policy.rules()) {
    PolicyRule r;
    r.name_glob = rule.name_glob();
    r.min_numel = rule.min_numel();
    r.max_numel = rule.max_numel();
    r.min_ndim = rule.min_ndim();
    r.max_ndim = rule.max_ndim();
    r.dtype = DTypeFromProto(rule.dtype());
    r.codec = CodecSpecFromProto(rule.codec());
    out.rules.push_back(std::move(r));
  }
  if (policy.has_dense_below_numel()) {
    out.dense_below_numel = policy.dense_below_numel();
  }
  if (policy.has_dense_1d()) out.dense_1d = policy.dense_1d();
  out.warmup_steps = policy.warmup_steps();
  if (!policy.default_codec().name().empty()) {
    out.default_codec = CodecSpecFromProto(policy.default_codec());
  }
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
  }
  out.set_dense_below_numel(policy.dense_below_numel);
  out.set_dense_1d(policy.dense_1d);
  out.set_warmup_steps(policy.warmup_steps);
  *out.mutable_default_codec() = CodecSpecToProto(policy.default_codec);
  return out;
}

}  // namespace gradcomp::service
