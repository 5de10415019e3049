// Runs a real gradcompd as a child process for integration tests: free
// local ports, a log file, readiness by GetInfo, SIGTERM on destruction.
//
//   GC_ASSIGN_OR_RETURN(std::unique_ptr<DaemonProcess> daemon,
//                       DaemonProcess::Start(DaemonBinary(), {}));
//   daemon->Connect();   // a Client of daemon->target(), "127.0.0.1:<port>"
//   HttpGet(daemon->metrics_port(), "/metrics");
#ifndef GRADCOMP_TESTS_INTEGRATION_DAEMON_PROCESS_H_
#define GRADCOMP_TESTS_INTEGRATION_DAEMON_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/free_port.h"
#include "client/cpp/client.h"

namespace gradcomp::testing {

// $GRADCOMPD if set, else gradcompd in the test's runfiles
// ($TEST_SRCDIR/gradcomp/service/gradcompd).
absl::StatusOr<std::string> DaemonBinary();

// The body of http://127.0.0.1:<port><path>; error unless the status is 200.
absl::StatusOr<std::string> HttpGet(int port, const std::string& path);

class DaemonProcess {
 public:
  // Starts `binary` with --listen, --metrics_listen and --world_size=1 on
  // free ports, then `extra_args`; returns once GetInfo answers. Retries
  // with new ports if the process exits early (a port taken meanwhile).
  // A --listen in `extra_args` (e.g. unix:/path) replaces the TCP one and
  // becomes target(). The readiness check's client sends $GRADCOMP_TOKEN
  // if set (for a daemon started with --client_token_file).
  static absl::StatusOr<std::unique_ptr<DaemonProcess>> Start(
      const std::string& binary, const std::vector<std::string>& extra_args,
      absl::Duration timeout = absl::Seconds(30));

  ~DaemonProcess();  // Stop()
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;

  std::string target() const { return target_; }
  // A client of target() whose channel has connected, within 30 s. A call
  // on a new channel fails at once if the channel's first connection
  // attempt fails, which on a loaded machine one did (a CI run saw the
  // port of a daemon that was serving refuse it); gRPC's reconnection,
  // waited for here, rides that out.
  absl::StatusOr<std::unique_ptr<client::Client>> Connect(
      client::ClientOptions options = {}) const;
  int metrics_port() const { return metrics_port_; }
  pid_t pid() const { return pid_; }
  // False once the process has exited (reaping it).
  bool Running();
  // For a daemon expected to give up (a refused handshake) that may have
  // answered GetInfo first: Unavailable with its exit status and log once
  // it has exited, within `timeout`; OK if it still runs then.
  absl::Status ExitedWithin(absl::Duration timeout);
  // The daemon's stdout and stderr so far.
  std::string Log() const;
  // SIGTERM, then SIGKILL after 10 s; returns the exit status as waitpid gives
  // it.
  int Stop();
  // SIGKILL at once (a crash: no shutdown runs), and reaps the process.
  void Kill();

 private:
  DaemonProcess(pid_t pid, std::string target, int metrics_port,
                std::string log_path)
      : pid_(pid),
        target_(std::move(target)),
        metrics_port_(metrics_port),
        log_path_(std::move(log_path)) {}

  absl::Status WaitServing(absl::Duration timeout);

  pid_t pid_;
  std::string target_;
  int metrics_port_;
  std::string log_path_;
  int exit_status_ = 0;
  bool exited_ = false;
};

}  // namespace gradcomp::testing

#endif  // GRADCOMP_TESTS_INTEGRATION_DAEMON_PROCESS_H_
