#include "service/config/utf8.h"

#include <string>

#include "gmock/gmock.h"
#include "gradcomp/v1/config.pb.h"
#include "gtest/gtest.h"

namespace gradcomp::service {
namespace {

using ::testing::HasSubstr;

TEST(Utf8Test, ConfigStringsAreCheckedByPath) {
  v1::DaemonConfig config;
  config.set_listen("unix:/run/gradcomp.sock");
  config.add_peers("h0:50052");
  config.add_peers("h1:50052");
  config.mutable_peer_tls()->set_ca_file("/etc/ca.crt");
  config.mutable_policy()->add_rules()->set_name_glob("fc*");
  EXPECT_TRUE(CheckStringsAreUtf8(config).ok());

  v1::DaemonConfig bad = config;
  bad.set_peers(1,
                "h1:500\x86"
                "52");
  absl::Status status = CheckStringsAreUtf8(bad);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              HasSubstr("peers[1] is not valid UTF-8: byte 0x86 at offset 6"));

  bad = config;
  bad.mutable_peer_tls()->set_ca_file("/etc/\xC0\x83");
  EXPECT_THAT(CheckStringsAreUtf8(bad).message(),
              HasSubstr("peer_tls.ca_file is not valid UTF-8: byte 0xC0"));

  bad = config;
  bad.mutable_policy()->mutable_rules(0)->set_name_glob("fc\xFF");
  EXPECT_THAT(CheckStringsAreUtf8(bad).message(),
              HasSubstr("policy.rules[0].name_glob is not valid UTF-8"));
}

}  // namespace
}  // namespace gradcomp::service
