#include "base/tcp_relay.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <map>

#include "absl/strings/str_cat.h"

namespace gradcomp::testing {
namespace {

sockaddr_in Loopback(int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return addr;
}

}  // namespace

TcpRelay::TcpRelay(int target_port) : target_port_(target_port) {
  listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = Loopback(0);
  socklen_t len = sizeof(addr);
  if (listen_fd_ < 0 ||
      bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(listen_fd_, 16) != 0 ||
      getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return;
  }
  port_ = ntohs(addr.sin_port);
  thread_ = std::thread([this] { Run(); });
}

TcpRelay::~TcpRelay() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  for (int fd : open_) close(fd);
  if (listen_fd_ >= 0) close(listen_fd_);
}

std::string TcpRelay::address() const {
  return absl::StrCat("127.0.0.1:", port_);
}

void TcpRelay::Run() {
  std::map<int, int> other;  // a forwarded connection's fd -> its pair's
  auto close_pair = [&other](int fd) {
    const int to = other[fd];
    shutdown(to, SHUT_RDWR);
    shutdown(fd, SHUT_RDWR);
    other.erase(to);
    other.erase(fd);
  };
  while (!stop_) {
    const Mode mode = mode_;
    if (mode == Mode::kCut) {
      while (!other.empty()) close_pair(other.begin()->first);
    }
    std::vector<pollfd> fds = {{listen_fd_, POLLIN, 0}};
    if (mode == Mode::kForwarding) {
      for (const auto& [fd, unused] : other) fds.push_back({fd, POLLIN, 0});
    }
    if (poll(fds.data(), fds.size(), 20) <= 0) continue;
    if (fds[0].revents & POLLIN) {
      const int client = accept(listen_fd_, nullptr, nullptr);
      if (client >= 0 && mode == Mode::kCut) {
        close(client);
      } else if (client >= 0) {
        open_.push_back(client);
        const int server =
            mode == Mode::kForwarding ? socket(AF_INET, SOCK_STREAM, 0) : -1;
        const sockaddr_in target = Loopback(target_port_);
        if (server >= 0) {
          open_.push_back(server);
          if (connect(server, reinterpret_cast<const sockaddr*>(&target),
                      sizeof(target)) == 0) {
            other[client] = server;
            other[server] = client;
          }
        }
      }
    }
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents == 0 || other.count(fds[i].fd) == 0) continue;
      char buffer[64 << 10];
      const ssize_t n = read(fds[i].fd, buffer, sizeof(buffer));
      const int to = other[fds[i].fd];
      bool written = n > 0;
      for (ssize_t done = 0; written && done < n;) {
        const ssize_t w = write(to, buffer + done, n - done);
        written = w > 0;
        done += w;
      }
      if (!written) close_pair(fds[i].fd);  // either side closed
    }
  }
}

}  // namespace gradcomp::testing
