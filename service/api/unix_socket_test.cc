#include "service/api/unix_socket.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "gmock/gmock.h"
#include "gradcomp/v1/gradcomp.grpc.pb.h"
#include "gtest/gtest.h"
#include "service/api/server.h"

namespace gradcomp::service {
namespace {

class EmptyService : public gradcomp::v1::Gradcomp::Service {};

// A unix socket bound at `path`, listening or not (-1 on failure).
int BoundSocket(const std::string& path, bool listening) {
  const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      (listening && listen(fd, 1) != 0)) {
    close(fd);
    return -1;
  }
  return fd;
}

// Whether something accepts connections at `path`.
bool Answers(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  const bool connected =
      connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return connected;
}

TEST(UnixSocketTest, ParsesOctalModes) {
  EXPECT_EQ(*ParseSocketMode("0660"), 0660u);
  EXPECT_EQ(*ParseSocketMode("600"), 0600u);
  EXPECT_EQ(*ParseSocketMode(kDefaultSocketMode), 0660u);
  for (const char* bad : {"", "0868", "rw-rw----", "07777", "1777", "-1"}) {
    EXPECT_EQ(ParseSocketMode(bad).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

TEST(UnixSocketTest, TcpAddressesAreLeftAlone) {
  EXPECT_TRUE(PrepareSocketDirectory("127.0.0.1:0").ok());
  EXPECT_TRUE(SetSocketMode("127.0.0.1:0", 0600).ok());
}

TEST(UnixSocketTest, CreatesTheDirectoryAndSetsTheSocketMode) {
  // TEST_TMPDIR is too long for a socket path (107 bytes at most).
  char base[] = "/tmp/gradcomp-uds-test-XXXXXX";
  ASSERT_NE(mkdtemp(base), nullptr);
  const std::string dir = std::string(base) + "/run/gradcomp";
  const std::string listen = "unix:" + dir + "/gradcomp.sock";
  ASSERT_TRUE(PrepareSocketDirectory(listen).ok());
  struct stat st;
  ASSERT_EQ(stat(dir.c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  // Twice is fine: the directory exists.
  ASSERT_TRUE(PrepareSocketDirectory(listen).ok());

  EmptyService service;
  auto server = StartGrpcServer(listen, &service);
  ASSERT_TRUE(server.ok()) << server.status();
  for (const mode_t mode : {mode_t{0660}, mode_t{0600}}) {
    ASSERT_TRUE(SetSocketMode(listen, mode).ok());
    ASSERT_EQ(stat((dir + "/gradcomp.sock").c_str(), &st), 0);
    EXPECT_TRUE(S_ISSOCK(st.st_mode));
    EXPECT_EQ(st.st_mode & 0777, mode);
  }
  (*server)->Shutdown();
  unlink((dir + "/gradcomp.sock").c_str());
  rmdir(dir.c_str());
  rmdir((std::string(base) + "/run").c_str());
  rmdir(base);
}

TEST(UnixSocketTest, AnUncreatableDirectoryIsAClearError) {
  if (geteuid() == 0) GTEST_SKIP() << "root may create anything";
  const absl::Status status =
      PrepareSocketDirectory("unix:/proc/gradcomp-no/gradcomp.sock");
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(status.message(), ::testing::HasSubstr("/proc/gradcomp-no"));
}

// gRPC replaces whatever socket file is at the path, so without a check a
// second daemon on the same --listen would take the socket over silently,
// and the first would delete it when it stopped. A socket that something
// listens on is refused; one left by a process that is gone is replaced.
TEST(UnixSocketTest, ASocketInUseIsAnErrorAndAStaleOneIsReplaced) {
  char base[] = "/tmp/gradcomp-uds-test-XXXXXX";
  ASSERT_NE(mkdtemp(base), nullptr);
  const std::string path = std::string(base) + "/gradcomp.sock";
  const std::string listen = "unix:" + path;
  EXPECT_TRUE(RefuseSocketInUse(listen).ok());  // nothing there yet

  EmptyService first_service, second_service;
  auto first = StartGrpcServer(listen, &first_service);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = StartGrpcServer(listen, &second_service);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(),
              ::testing::HasSubstr("cannot serve gRPC on '" + listen +
                                   "': another process listens on it"));
  EXPECT_TRUE(Answers(path));  // the first still has its socket
  (*first)->Shutdown();
  first->reset();

  unlink(path.c_str());
  const int stale = BoundSocket(path, /*listening=*/false);
  ASSERT_GE(stale, 0);
  close(stale);  // the file stays; nothing listens
  EXPECT_TRUE(RefuseSocketInUse(listen).ok());
  auto third = StartGrpcServer(listen, &second_service);
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_TRUE(Answers(path));
  (*third)->Shutdown();
  third->reset();
  unlink(path.c_str());
  rmdir(base);
}

}  // namespace
}  // namespace gradcomp::service
