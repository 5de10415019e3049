// Tests only: a TCP relay on 127.0.0.1 in front of a listener, for tests of
// what peers see when the network between them fails. It forwards bytes
// both ways until told otherwise:
//  - Freeze: every socket stays open and nothing is forwarded, as a peer
//    looks whose host lost power or fell behind a network split: no FIN,
//    no RST, only silence. Connections that come meanwhile are held so.
//  - Cut: every forwarded connection is closed, and connections that come
//    meanwhile are closed at once, as a link that is down.
//  - Restore: connections that come after it are forwarded again.
//
//   gradcomp::testing::TcpRelay relay(target_port);
//   ASSERT_TRUE(relay.ok());
//   dial(relay.address());  relay.Cut();  ...  relay.Restore();
#ifndef GRADCOMP_BASE_TCP_RELAY_H_
#define GRADCOMP_BASE_TCP_RELAY_H_

#include <atomic>
#include <string>
#include <thread>
#include <vector>

namespace gradcomp::testing {

class TcpRelay {
 public:
  // Forwards to 127.0.0.1:`target_port`; check ok() before use.
  explicit TcpRelay(int target_port);
  ~TcpRelay();
  TcpRelay(const TcpRelay&) = delete;
  TcpRelay& operator=(const TcpRelay&) = delete;

  bool ok() const { return port_ != 0; }
  // "127.0.0.1:<port>", where it listens.
  std::string address() const;

  void Freeze() { mode_ = Mode::kFrozen; }
  void Cut() { mode_ = Mode::kCut; }
  void Restore() { mode_ = Mode::kForwarding; }

 private:
  enum class Mode { kForwarding, kFrozen, kCut };

  void Run();

  const int target_port_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::vector<int> open_;  // every socket, closed at the end
  std::atomic<Mode> mode_{Mode::kForwarding};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace gradcomp::testing

#endif  // GRADCOMP_BASE_TCP_RELAY_H_
