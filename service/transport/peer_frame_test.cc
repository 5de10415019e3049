#include "service/transport/peer_frame.h"

#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/transport/peer_frame_testing.h"

namespace gradcomp::service {
namespace {

using ::testing::HasSubstr;

grpc::ByteBuffer FromString(const std::string& bytes) {
  grpc::Slice slice(bytes.data(), bytes.size());
  return grpc::ByteBuffer(&slice, 1);
}

std::string Join(const std::vector<absl::string_view>& pieces) {
  std::string out;
  for (absl::string_view p : pieces) out.append(p.data(), p.size());
  return out;
}

TEST(PeerFrameTest, ADataFrameIsAPeerFrameWithoutCopyingItsChunk) {
  auto owner = std::make_shared<std::string>("0123456789");
  v1::MessageHeader header;
  header.set_tensor("fc1.weight");
  header.set_total_bytes(13);
  const absl::string_view pieces[] = {absl::string_view(*owner).substr(2, 5),
                                      "", absl::string_view(*owner)};
  const grpc::ByteBuffer frame = DataFrame(&header, pieces, 0xdeadbeef, owner);
  EXPECT_GT(owner.use_count(), 1);  // the frame holds the bytes

  // The generated classes read it ...
  v1::PeerFrame parsed;
  ASSERT_TRUE(parsed.ParseFromString(FrameBytes(frame)));
  EXPECT_EQ(parsed.header().tensor(), "fc1.weight");
  EXPECT_EQ(parsed.chunk(), "234560123456789");
  EXPECT_EQ(parsed.chunk_crc32c(), 0xdeadbeefu);

  // ... and so does ParseFrame.
  absl::StatusOr<ReceivedFrame> got = ParseFrame(frame);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(got->header.has_value());
  EXPECT_EQ(got->header->total_bytes(), 13u);
  EXPECT_FALSE(got->hello.has_value());
  EXPECT_EQ(Join(got->chunk), "234560123456789");
  EXPECT_EQ(got->chunk_size, 15u);
  EXPECT_EQ(got->chunk_crc32c, 0xdeadbeefu);
}

TEST(PeerFrameTest, ReadsWhatTheGeneratedClassesWrite) {
  v1::PeerFrame hello;
  hello.mutable_hello()->set_rank(3);
  hello.mutable_hello()->set_policy_hash("abc");
  absl::StatusOr<ReceivedFrame> got =
      ParseFrame(FromString(hello.SerializeAsString()));
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(got->hello.has_value());
  EXPECT_EQ(got->hello->rank(), 3u);
  EXPECT_EQ(got->hello->policy_hash(), "abc");
  EXPECT_EQ(got->chunk_size, 0u);

  v1::Hello h;
  h.set_world_size(4);
  absl::StatusOr<ReceivedFrame> round = ParseFrame(HelloFrame(h));
  ASSERT_TRUE(round.ok());
  EXPECT_EQ(round->hello->world_size(), 4u);

  v1::PeerFrame chunk;
  chunk.set_chunk(std::string(300, 'z'));
  chunk.set_chunk_crc32c(7);
  got = ParseFrame(FromString(chunk.SerializeAsString()));
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(Join(got->chunk), std::string(300, 'z'));
  EXPECT_EQ(got->chunk_crc32c, 7u);
}

TEST(PeerFrameTest, SkipsUnknownFieldsAndRefusesTruncatedFrames) {
  v1::PeerFrame chunk;
  chunk.set_chunk("abc");
  // Field 9 as a varint and field 10 as bytes: a later version's fields.
  const std::string bytes =
      chunk.SerializeAsString() + std::string("\x48\x05\x52\x02xy", 6);
  absl::StatusOr<ReceivedFrame> got = ParseFrame(FromString(bytes));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(Join(got->chunk), "abc");

  const std::string whole = chunk.SerializeAsString();
  got = ParseFrame(FromString(whole.substr(0, whole.size() - 1)));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(got.status().message(), HasSubstr("truncated chunk"));
}

}  // namespace
}  // namespace gradcomp::service
