// Conversions between the API's gradcomp.v1.Policy / CodecSpec / DType and
// the engine's core types, in one place for the config loader and the gRPC
// shell. PolicyFromProto applies the documented defaults of unset fields;
// PolicyToProto writes every field, so what GetPolicy shows is what runs.
//
//   GC_ASSIGN_OR_RETURN(Policy core, PolicyFromProto(request.policy()));
//   v1::Policy shown = PolicyToProto(core);
#ifndef GRADCOMP_SERVICE_CONFIG_POLICY_PROTO_H_
#define GRADCOMP_SERVICE_CONFIG_POLICY_PROTO_H_

#include "absl/status/statusor.h"
#include "gradcomp/v1/gradcomp.pb.h"
#include "service/engine/dtype.h"
#include "service/engine/policy.h"

namespace gradcomp::service {

namespace v1 = ::gradcomp::v1;

// Values are passed through unchecked (the engine rejects unknown ones
// with a message naming the accepted types).
inline DType DTypeFromProto(v1::DType dtype) {
  return static_cast<DType>(static_cast<int>(dtype));
}
inline v1::DType DTypeToProto(DType dtype) {
  return static_cast<v1::DType>(static_cast<int>(dtype));
}

CodecSpec CodecSpecFromProto(const v1::CodecSpec& spec);
v1::CodecSpec CodecSpecToProto(const CodecSpec& spec);

// An empty default_codec name means "none", unset optionals their defaults.
// InvalidArgument for what a Policy cannot hold: default_codec params
// without a name, an aggregation number this build does not know.
absl::StatusOr<Policy> PolicyFromProto(const v1::Policy& policy);
v1::Policy PolicyToProto(const Policy& policy);

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_CONFIG_POLICY_PROTO_H_
