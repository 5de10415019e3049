// libFuzzer entry point: each input is one message from a peer daemon
// (first byte: the parser, second: its parameter, rest: the message) given
// to CheckPeerMessage.
#include <cstddef>
#include <cstdint>

#include "service/collective/fuzz/peer_message_checker.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)gradcomp::service::CheckPeerMessage(data, size);
  return 0;
}
