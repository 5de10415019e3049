// libFuzzer entry point: each input is one client request (first byte: the
// RPC, rest: its serialized proto) given to RequestChecker.
#include <cstddef>
#include <cstdint>

#include "service/api/fuzz/request_checker.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  gradcomp::service::RequestChecker::Get().Check(data, size);
  return 0;
}
