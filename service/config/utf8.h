// UTF-8 checks for the strings of a config. Protobuf's text-format parser
// takes any bytes in a string field, but the JSON printer (--check_config)
// cannot print invalid UTF-8, and an address or a glob made of such bytes
// only fails later, when it is used; so validation refuses them, naming
// the field.
//
//   GC_RETURN_IF_ERROR(CheckStringsAreUtf8(config));
#ifndef GRADCOMP_SERVICE_CONFIG_UTF8_H_
#define GRADCOMP_SERVICE_CONFIG_UTF8_H_

#include "absl/status/status.h"
#include "google/protobuf/message.h"

namespace gradcomp::service {

// Every string field of `message` and of the messages in it (repeated
// fields and maps included): INVALID_ARGUMENT naming the first that is not
// UTF-8, by its path (`peers[1]`, `policy.rules[0].name_glob`), the byte
// and its offset.
absl::Status CheckStringsAreUtf8(const google::protobuf::Message& message);

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_CONFIG_UTF8_H_
