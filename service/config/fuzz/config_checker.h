// Checks the config parser and validator on arbitrary bytes, as the daemon
// meets a config file at start: the first byte picks the file name (and so
// the format: JSON, text format, or sniffed), the rest is the file's text.
// Parsing and validation must end in a status, never a crash; an invalid
// file must be InvalidArgument naming the problem; and a valid config must
// survive what --check_config prints: its JSON parses back to the same
// config, which validates again. Used by config_fuzzer (libFuzzer) and
// config_corpus_test (gcc).
//
//   CheckConfigBytes(data, size);  // aborts with "config_fuzzer: ..." on a
//                                  // broken promise
#ifndef GRADCOMP_SERVICE_CONFIG_FUZZ_CONFIG_CHECKER_H_
#define GRADCOMP_SERVICE_CONFIG_FUZZ_CONFIG_CHECKER_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

namespace gradcomp::service {

// The status of parsing then validating the input (OK: a valid config).
absl::Status CheckConfigBytes(const uint8_t* data, size_t size);

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_CONFIG_FUZZ_CONFIG_CHECKER_H_
