// libFuzzer entry point: each input is a config file (first byte: its
// name's format, rest: its text) given to CheckConfigBytes.
#include <cstddef>
#include <cstdint>

#include "service/config/fuzz/config_checker.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)gradcomp::service::CheckConfigBytes(data, size);
  return 0;
}
