// Tests only: a TCP port on 127.0.0.1 for a server a test starts.
//
//   GC_ASSIGN_OR_RETURN(const int port, gradcomp::testing::FreePort());
#ifndef GRADCOMP_BASE_FREE_PORT_H_
#define GRADCOMP_BASE_FREE_PORT_H_

#include "absl/status/statusor.h"

namespace gradcomp::testing {

// A TCP port that was free on 127.0.0.1 when asked (another process may take
// it before the caller binds it), and that no earlier call in this process
// returned. It is a random one below the kernel's ephemeral range when there
// is room, since the kernel hands out its own ports (port-0 servers, the
// source ports of connections) from that range and hands a released one out
// again within a few hundred binds; else the kernel's choice.
absl::StatusOr<int> FreePort();

}  // namespace gradcomp::testing

#endif  // GRADCOMP_BASE_FREE_PORT_H_
