#include "service/api/unix_socket.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "gmock/gmock.h"
#include "gradcomp/v1/gradcomp.grpc.pb.h"
#include "gtest/gtest.h"
#include "service/api/server.h"

namespace gradcomp::service {
namespace {

class EmptyService : public gradcomp::v1::Gradcomp::Service {};

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

}  // namespace
}  // namespace gradcomp::service
