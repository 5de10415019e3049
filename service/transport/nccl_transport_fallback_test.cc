// The NCCL transport on a machine without a GPU (CI): joining fails with a
// clear Unavailable, nothing crashes; the unique id and the message key's wire
// form need no GPU and are checked here too.
#include <string>

#include "codecs/cuda/device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/transport/nccl_transport.h"
#include "service/transport/nccl_transport_exchange.h"
#include "service/transport/nccl_transport_testing.h"

namespace gradcomp::service {
namespace {

using ::testing::HasSubstr;

TEST(NcclTransportFallbackTest, UniqueIdNeedsNoGpu) {
  absl::StatusOr<std::string> a = NewNcclUniqueId();
  absl::StatusOr<std::string> b = NewNcclUniqueId();
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->size(), 128u);
  EXPECT_NE(*a, *b);
}

TEST(NcclTransportFallbackTest, CreateWithoutGpuIsUnavailable) {
  if (codecs::cuda::CudaDeviceAvailable().ok()) {
    GTEST_SKIP() << "a GPU answered; the fallback is not taken";
  }
  FailingReceiver receiver;
  absl::StatusOr<std::unique_ptr<NcclTransport>> transport =
      CreateOneRankNcclTransport(&receiver);
  ASSERT_EQ(transport.status().code(), absl::StatusCode::kUnavailable)
      << transport.status();
  EXPECT_THAT(transport.status().message(), HasSubstr("CUDA"));
}

TEST(NcclTransportFallbackTest, BadArgumentsAreRejectedBeforeTheGpu) {
  FailingReceiver receiver;
  NcclTransport::Options options;
  options.unique_id = "short";
  absl::Status status = NcclTransport::Create(options, &receiver).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("expected 128"));

  absl::StatusOr<std::string> id = NewNcclUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  options.unique_id = *id;
  options.rank = 2;
  options.world_size = 2;
  status = NcclTransport::Create(options, &receiver).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("rank 2 of world size 2"));
}

TEST(NcclTransportFallbackTest, MessageKeyRoundTrips) {
  const MessageKey key{"job-7", "fc1.weight", -3, 2, Phase::kNeighbours};
  const std::string payload = EncodeNcclMessageKey(key) + "data";
  absl::StatusOr<std::pair<MessageKey, size_t>> decoded =
      DecodeNcclMessageKey(payload);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->first, key);
  EXPECT_EQ(payload.substr(decoded->second), "data");
}

TEST(NcclTransportFallbackTest, TruncatedOrBadKeyIsDataLoss) {
  const std::string encoded =
      EncodeNcclMessageKey({"j", "t", 1, 0, Phase::kAllgather});
  for (size_t n = 0; n < encoded.size(); ++n) {
    EXPECT_EQ(DecodeNcclMessageKey(encoded.substr(0, n)).status().code(),
              absl::StatusCode::kDataLoss)
        << n << " bytes";
  }
  std::string bad_phase = encoded;
  bad_phase.back() = 9;
  const absl::Status status = DecodeNcclMessageKey(bad_phase).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("phase 9, expected 1..6"));
}

}  // namespace
}  // namespace gradcomp::service
