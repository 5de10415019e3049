#include "service/api/client_auth.h"

#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradcomp::service {
namespace {

using ::testing::HasSubstr;

constexpr char kToken[] = "s3cret-token-0123456789";

ClientAuth WithToken() {
  ClientAuthOptions options;
  options.token = kToken;
  return ClientAuth(options);
}

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = std::string(getenv("TEST_TMPDIR")) + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(ClientAuthTest, TheRightBearerTokenIsServedOverTcp) {
  EXPECT_TRUE(
      WithToken()
          .Authorize("ipv4:10.1.2.3:4000", absl::StrCat(kBearerPrefix, kToken))
          .ok());
}

TEST(ClientAuthTest, NoTokenAWrongTokenOrAnotherSchemeIsUnauthenticated) {
  const ClientAuth auth = WithToken();
  const absl::Status none = auth.Authorize("ipv4:127.0.0.1:4000", {});
  EXPECT_EQ(none.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(none.message(), HasSubstr("Bearer <token>"));
  for (const std::string& wrong :
       {std::string("Bearer wrong"), absl::StrCat("Bearer ", kToken, "x"),
        absl::StrCat("Bearer ", std::string(kToken).substr(1)),
        absl::StrCat("Basic ", kToken), std::string(kToken)}) {
    EXPECT_EQ(auth.Authorize("ipv4:127.0.0.1:4000", wrong).code(),
              absl::StatusCode::kUnauthenticated)
        << wrong;
  }
}

TEST(ClientAuthTest, UnixSocketCallsAreLeftToTheSocketPermissions) {
  EXPECT_TRUE(WithToken().Authorize("unix:", {}).ok());
  EXPECT_TRUE(ClientAuth({}).Authorize("unix:/run/x.sock", {}).ok());
}

TEST(ClientAuthTest, WithoutATokenOnlyLoopbackTcpPeersAreServed) {
  const ClientAuth auth({});
  for (const char* peer :
       {"ipv4:127.0.0.1:5000", "ipv4:127.8.9.1:5000", "ipv6:[::1]:5000",
        "ipv6:%5B::1%5D:5000", "ipv6:[::ffff:127.0.0.1]:5000"}) {
    EXPECT_TRUE(auth.Authorize(peer, {}).ok()) << peer;
  }
  for (const char* peer : {"ipv4:10.0.0.1:5000", "ipv6:[fe80::1]:5000",
                           "ipv4:128.0.0.1:5000", "garbage", ""}) {
    const absl::Status status = auth.Authorize(peer, {});
    EXPECT_EQ(status.code(), absl::StatusCode::kUnauthenticated) << peer;
  }
  ClientAuthOptions open;
  open.allow_unauthenticated_tcp = true;
  EXPECT_TRUE(ClientAuth(open).Authorize("ipv4:10.0.0.1:5000", {}).ok());
}

TEST(ClientAuthTest, NonLoopbackTcpWithoutATokenFailsAtStart) {
  const absl::Status status = CheckListenAddress("0.0.0.0:50051", {});
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("--client_token_file"));
  EXPECT_FALSE(CheckListenAddress(":50051", {}).ok());
  EXPECT_FALSE(CheckListenAddress("[::]:50051", {}).ok());
  for (const char* ok : {"127.0.0.1:0", "[::1]:1", "localhost:5",
                         "unix:/run/gradcomp/gradcomp.sock"}) {
    EXPECT_TRUE(CheckListenAddress(ok, {}).ok()) << ok;
  }
  ClientAuthOptions token;
  token.token = kToken;
  EXPECT_TRUE(CheckListenAddress("0.0.0.0:50051", token).ok());
  ClientAuthOptions open;
  open.allow_unauthenticated_tcp = true;
  EXPECT_TRUE(CheckListenAddress("0.0.0.0:50051", open).ok());
}

TEST(ClientAuthTest, ConstantTimeEqualsComparesContentAndLength) {
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "ab"));
  EXPECT_FALSE(ConstantTimeEquals("ab", "abc"));
  EXPECT_FALSE(ConstantTimeEquals(std::string("a\0", 2), "a"));
}

TEST(ClientAuthTest, TokenFileIsTrimmedAndChecked) {
  absl::StatusOr<std::string> token =
      ReadClientToken(WriteFile("good", absl::StrCat("  ", kToken, "\n")));
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, kToken);
  EXPECT_EQ(ReadClientToken(WriteFile("short", "abc\n")).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadClientToken(WriteFile("space", "0123456789 abcdefgh"))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadClientToken("/nonexistent/token").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(ClientAuthFromFlags("/nonexistent/token", false).status().code(),
            absl::StatusCode::kNotFound);
  absl::StatusOr<ClientAuthOptions> none = ClientAuthFromFlags("", true);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->token.empty());
  EXPECT_TRUE(none->allow_unauthenticated_tcp);
}

// A directory opens as a stream and reads as "": it was refused only for
// holding 0 bytes, and a read error was swallowed the same way.
TEST(ClientAuthTest, ATokenDirectoryIsNoFile) {
  const absl::Status status =
      ReadClientToken(std::string(getenv("TEST_TMPDIR"))).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("is a directory"));
  EXPECT_THAT(status.message(), HasSubstr("client token file"));
}

TEST(ClientAuthTest, ATokenByteGrpcCannotSendIsNamed) {
  const absl::Status status =
      ReadClientToken(WriteFile("umlaut", "t\xc3\xb6ken-of-enough-bytes"))
          .status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("holds byte 0xc3"));
}

}  // namespace
}  // namespace gradcomp::service
