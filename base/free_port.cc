#include "base/free_port.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>
#include <random>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace gradcomp::testing {
namespace {

// Binds 127.0.0.1:`port` (0: the kernel's choice) and returns the port
// bound; nullopt if that port is taken.
absl::StatusOr<std::optional<int>> TryPort(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int error = errno;
    close(fd);
    if (port != 0 && (error == EADDRINUSE || error == EACCES)) {
      return std::optional<int>();
    }
    return absl::InternalError(
        absl::StrCat("bind 127.0.0.1:", port, ": ", std::strerror(error)));
  }
  const int got = getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const int error = errno;
  close(fd);
  if (got != 0) {
    return absl::InternalError(
        absl::StrCat("getsockname: ", std::strerror(error)));
  }
  return std::optional<int>(ntohs(addr.sin_port));
}

// Up to 12000 ports just below the kernel's ephemeral range, or nullopt.
// bind(0) and the source ports of outgoing connections come from that range,
// so a port picked below it is not given to another test's port-0 server,
// nor to some connection, before the server it is for binds it.
std::optional<std::pair<int, int>> BelowEphemeralRange() {
  std::ifstream file("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0;
  if (!(file >> low)) return std::nullopt;
  const int start = std::max(1024, low - 12000);
  if (low - start < 1000) return std::nullopt;
  return std::make_pair(start, low - 1);
}

struct HandedOut {
  absl::Mutex mu;
  absl::flat_hash_set<int> ports ABSL_GUARDED_BY(mu);
  std::mt19937 random ABSL_GUARDED_BY(mu){std::random_device()()};
  const std::optional<std::pair<int, int>> range = BelowEphemeralRange();
};

}  // namespace

absl::StatusOr<int> FreePort() {
  static HandedOut* const handed_out = new HandedOut();
  absl::MutexLock lock(&handed_out->mu);
  for (int attempt = 0; attempt < 1000; ++attempt) {
    int candidate = 0;
    if (handed_out->range.has_value() && attempt < 500) {
      std::uniform_int_distribution<int> pick(handed_out->range->first,
                                              handed_out->range->second);
      candidate = pick(handed_out->random);
    }
    absl::StatusOr<std::optional<int>> port = TryPort(candidate);
    if (!port.ok()) return port.status();
    if (!port->has_value()) continue;
    if (handed_out->ports.insert(**port).second) return **port;
  }
  return absl::ResourceExhaustedError("no free TCP port on 127.0.0.1");
}

}  // namespace gradcomp::testing
