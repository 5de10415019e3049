#include "base/free_port.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace gradcomp::testing {
namespace {

// The kernel's choice for port 0 on 127.0.0.1.
absl::StatusOr<int> KernelPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const absl::Status status = absl::InternalError(
        absl::StrCat("bind 127.0.0.1:0: ", std::strerror(errno)));
    close(fd);
    return status;
  }
  close(fd);
  return ntohs(addr.sin_port);
}

struct HandedOut {
  absl::Mutex mu;
  absl::flat_hash_set<int> ports ABSL_GUARDED_BY(mu);
};

}  // namespace

absl::StatusOr<int> FreePort() {
  static HandedOut* const handed_out = new HandedOut();
  while (true) {
    absl::StatusOr<int> port = KernelPort();
    if (!port.ok()) return port;
    absl::MutexLock lock(&handed_out->mu);
    if (handed_out->ports.insert(*port).second) return port;
  }
}

}  // namespace gradcomp::testing
