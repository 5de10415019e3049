#include "tests/integration/daemon_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "client/cpp/client.h"

namespace gradcomp::testing {
namespace {

absl::Status ErrnoError(absl::string_view what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

// A TCP socket connected to 127.0.0.1:port.
absl::StatusOr<int> ConnectLocal(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return ErrnoError("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const absl::Status status =
        ErrnoError(absl::StrCat("connect to 127.0.0.1:", port));
    close(fd);
    return status;
  }
  return fd;
}

}  // namespace

absl::StatusOr<std::string> DaemonBinary() {
  if (const char* env = std::getenv("GRADCOMPD"); env != nullptr && *env) {
    return std::string(env);
  }
  const char* srcdir = std::getenv("TEST_SRCDIR");
  if (srcdir == nullptr) {
    return absl::FailedPreconditionError(
        "neither $GRADCOMPD nor $TEST_SRCDIR is set: run under bazel test");
  }
  std::string path = absl::StrCat(srcdir, "/gradcomp/service/gradcompd");
  if (access(path.c_str(), X_OK) != 0) {
    return absl::NotFoundError(
        absl::StrCat("no executable gradcompd at ", path));
  }
  return path;
}

absl::StatusOr<std::string> HttpGet(int port, const std::string& path) {
  GC_ASSIGN_OR_RETURN(const int fd, ConnectLocal(port));
  // HTTP/1.0: the server closes the connection after the body.
  const std::string request =
      absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
  if (write(fd, request.data(), request.size()) !=
      static_cast<ssize_t>(request.size())) {
    const absl::Status status = ErrnoError("write HTTP request");
    close(fd);
    return status;
  }
  std::string response;
  char buf[65536];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) response.append(buf, n);
  close(fd);
  if (n < 0) return ErrnoError("read HTTP response");
  const size_t body = response.find("\r\n\r\n");
  if (body == std::string::npos) {
    return absl::DataLossError(
        absl::StrCat("no HTTP header end in: ", response));
  }
  const std::string status_line = response.substr(0, response.find("\r\n"));
  if (!absl::StrContains(status_line, " 200 ")) {
    return absl::UnavailableError(
        absl::StrCat("GET ", path, " on port ", port, ": ", status_line));
  }
  return response.substr(body + 4);
}

absl::StatusOr<std::unique_ptr<DaemonProcess>> DaemonProcess::Start(
    const std::string& binary, const std::vector<std::string>& extra_args,
    absl::Duration timeout) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  absl::Status last;
  for (int attempt = 0; attempt < 3; ++attempt) {
    GC_ASSIGN_OR_RETURN(const int port, FreePort());
    GC_ASSIGN_OR_RETURN(const int metrics_port, FreePort());
    const std::string log_path = absl::StrCat(tmp != nullptr ? tmp : "/tmp",
                                              "/gradcompd-", port, ".log");
    std::string target = absl::StrCat("127.0.0.1:", port);
    for (const std::string& arg : extra_args) {
      if (absl::StartsWith(arg, "--listen=")) target = arg.substr(9);
    }
    std::vector<std::string> args = {
        binary, absl::StrCat("--listen=127.0.0.1:", port),
        absl::StrCat("--metrics_listen=127.0.0.1:", metrics_port),
        "--world_size=1"};
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    std::vector<char*> argv;
    for (std::string& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);

    const pid_t pid = fork();
    if (pid < 0) return ErrnoError("fork");
    if (pid == 0) {
      // Child: only async-signal-safe calls until exec.
      const int log =
          open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (log >= 0) {
        dup2(log, STDOUT_FILENO);
        dup2(log, STDERR_FILENO);
      }
      execv(argv[0], argv.data());
      _exit(127);
    }
    std::unique_ptr<DaemonProcess> daemon(
        new DaemonProcess(pid, target, metrics_port, log_path));
    last = daemon->WaitServing(timeout);
    if (last.ok()) return daemon;
    if (daemon->Running()) return last;  // up but not answering: no retry
  }
  return last;
}

absl::Status DaemonProcess::WaitServing(absl::Duration timeout) {
  client::ClientOptions options;
  options.rpc_timeout = absl::Seconds(2);
  const absl::Time deadline = absl::Now() + timeout;
  absl::Status status;
  while (absl::Now() < deadline) {
    if (!Running()) {
      return absl::UnavailableError(
          absl::StrCat("gradcompd exited with status ", exit_status_,
                       " before serving; log:\n", Log()));
    }
    // A fresh channel per try: a channel that failed to connect backs off
    // for a second or more before it tries again.
    GC_ASSIGN_OR_RETURN(std::unique_ptr<client::Client> client,
                        client::Client::Connect(target(), options));
    status = client->GetInfo().status();
    if (status.ok()) return status;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "gradcompd did not answer GetInfo in ", absl::FormatDuration(timeout),
      " (last: ", status.ToString(), "); log:\n", Log()));
}

absl::Status DaemonProcess::ExitedWithin(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (Running()) {
    if (absl::Now() > deadline) return absl::OkStatus();
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::UnavailableError(absl::StrCat("gradcompd exited with status ",
                                             exit_status_, "; log:\n", Log()));
}

absl::StatusOr<std::unique_ptr<client::Client>> DaemonProcess::Connect(
    client::ClientOptions options) const {
  GC_ASSIGN_OR_RETURN(std::unique_ptr<client::Client> client,
                      client::Client::Connect(target_, std::move(options)));
  GC_RETURN_IF_ERROR(client->WaitForReady(absl::Seconds(30)));
  return client;
}

bool DaemonProcess::Running() {
  if (exited_) return false;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) == pid_) {
    exited_ = true;
    exit_status_ = status;
    return false;
  }
  return true;
}

std::string DaemonProcess::Log() const {
  std::ifstream in(log_path_);
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

int DaemonProcess::Stop() {
  if (!Running()) return exit_status_;
  kill(pid_, SIGTERM);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (Running() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  if (Running()) {
    kill(pid_, SIGKILL);
    waitpid(pid_, &exit_status_, 0);
    exited_ = true;
  }
  return exit_status_;
}

void DaemonProcess::Kill() {
  if (!Running()) return;
  kill(pid_, SIGKILL);
  waitpid(pid_, &exit_status_, 0);
  exited_ = true;
}

DaemonProcess::~DaemonProcess() { Stop(); }

}  // namespace gradcomp::testing
