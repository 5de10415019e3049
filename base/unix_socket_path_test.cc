#include "base/unix_socket_path.h"

#include <sys/un.h>

#include <optional>

#include "gtest/gtest.h"

namespace gradcomp {
namespace {

TEST(UnixSocketPathTest, ReadsBothFormsAsGrpcDoes) {
  EXPECT_EQ(UnixSocketPath("unix:/run/gradcomp/gradcomp.sock"),
            "/run/gradcomp/gradcomp.sock");
  EXPECT_EQ(UnixSocketPath("unix:///run/gradcomp.sock"), "/run/gradcomp.sock");
  EXPECT_EQ(UnixSocketPath("unix:relative.sock"), "relative.sock");
  EXPECT_EQ(UnixSocketPath("unix:"), "");
  for (const char* other : {"127.0.0.1:5000", "dns:///host:1", "localhost:9",
                            "unix-abstract:name", "UNIX:/x"}) {
    EXPECT_EQ(UnixSocketPath(other), std::nullopt) << other;
  }
}

TEST(UnixSocketPathTest, TheLimitIsWhatSunPathHolds) {
  EXPECT_EQ(kMaxUnixSocketPathBytes, sizeof(sockaddr_un::sun_path) - 1);
}

}  // namespace
}  // namespace gradcomp
