// Tests only: a TCP port on 127.0.0.1 for a server a test starts.
//
//   GC_ASSIGN_OR_RETURN(const int port, gradcomp::testing::FreePort());
#ifndef GRADCOMP_BASE_FREE_PORT_H_
#define GRADCOMP_BASE_FREE_PORT_H_

#include "absl/status/statusor.h"

namespace gradcomp::testing {

// A TCP port that was free on 127.0.0.1 when asked (the kernel's choice for
// port 0; another process may take it before the caller binds it), and that
// no earlier call in this process returned. The kernel hands a released port
// out again within a few hundred binds, so without that a peer port chosen
// for a daemon not started yet could come back as another server's port.
absl::StatusOr<int> FreePort();

}  // namespace gradcomp::testing

#endif  // GRADCOMP_BASE_FREE_PORT_H_
