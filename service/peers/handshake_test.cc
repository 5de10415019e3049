#include "service/peers/handshake.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradcomp::service {
namespace {

using ::testing::HasSubstr;

PeerIdentity Identity(int rank) {
  PeerIdentity id;
  id.version = "0.1.0";
  id.wire_version = 1;
  id.world_size = 4;
  id.rank = rank;
  id.policy_hash = "abc";
  id.seed = 7;
  id.instance = 100 + rank;
  return id;
}

TEST(HandshakeTest, MatchingPeersAreAccepted) {
  EXPECT_TRUE(CheckPeer(Identity(0), Identity(2), 2, "h2:1").ok());
  EXPECT_TRUE(CheckPeer(Identity(2), Identity(0), std::nullopt, "h0:1").ok());
}

TEST(HandshakeTest, EachMismatchNamesBothSides) {
  struct Case {
    void (*change)(PeerIdentity&);
    const char* message;
  };
  const Case cases[] = {
      {[](PeerIdentity& p) { p.version = "0.2.0"; },
       "the gradcompd version is '0.2.0' on rank 2 (h2:1) but '0.1.0' on rank "
       "0 (this daemon)"},
      {[](PeerIdentity& p) { p.wire_version = 2; },
       "the wire format version is 2 on rank 2 (h2:1) but 1 on rank 0"},
      {[](PeerIdentity& p) { p.protocol_version = 9; },
       "the peer protocol version is 9 on rank 2"},
      {[](PeerIdentity& p) { p.world_size = 3; },
       "world_size is 3 on rank 2 (h2:1) but 4 on rank 0"},
      {[](PeerIdentity& p) { p.policy_hash = "def"; },
       "the policy hash is 'def' on rank 2 (h2:1) but 'abc' on rank 0"},
      {[](PeerIdentity& p) { p.seed = 8; },
       "the codec seed is 8 on rank 2 (h2:1) but 7 on rank 0"},
      {[](PeerIdentity& p) { p.group = "ns/other"; },
       "the peer group is 'ns/other' on rank 2 (h2:1) but '' on rank 0 (this "
       "daemon); expected the same --peer_group on every daemon of a job"},
  };
  for (const Case& c : cases) {
    PeerIdentity remote = Identity(2);
    c.change(remote);
    const absl::Status status = CheckPeer(Identity(0), remote, 2, "h2:1");
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(status.message(), HasSubstr(c.message));
  }
}

TEST(HandshakeTest, RanksMustBeDistinctInRangeAndWhereTheyWereDialled) {
  PeerIdentity other_one = Identity(1);
  other_one.instance = 7;
  absl::Status same = CheckPeer(Identity(1), other_one, std::nullopt, "h:1");
  EXPECT_EQ(same.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(same.message(),
              HasSubstr("says it is rank 1 and this daemon is rank 1 of 4"));
  EXPECT_FALSE(CheckPeer(Identity(1), Identity(4), std::nullopt, "h:1").ok());
  absl::Status wrong = CheckPeer(Identity(0), Identity(3), 2, "h2:1");
  EXPECT_EQ(wrong.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(wrong.message(),
              HasSubstr("rank 0 dialled h2:1 as rank 2 (--peers entry 2) but "
                        "the daemon there is rank 3"));
}

// A --peers entry that is this daemon's own --listen address: the dialled
// server answers with this process's instance, whatever rank it claims.
TEST(HandshakeTest, ReachingItselfIsNamed) {
  const absl::Status self = CheckPeer(Identity(1), Identity(1), 3, "h3:1");
  EXPECT_EQ(self.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(self.message(),
              HasSubstr("rank 1 reached itself at h3:1 (dialled as rank 3, "
                        "--peers entry 3)"));
  EXPECT_THAT(
      CheckPeer(Identity(1), Identity(1), std::nullopt, "h:1").message(),
      HasSubstr("rank 1 reached itself at h:1;"));
}

}  // namespace
}  // namespace gradcomp::service
