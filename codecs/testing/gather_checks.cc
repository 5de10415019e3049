#include "codecs/testing/gather_checks.h"

#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace gradcomp::codecs::testing {

std::vector<float> ExpectGatherMatchesTheDefault(
    const SingleRoundCodec& codec, absl::Span<const Bytes> payloads,
    size_t numel) {
  std::vector<float> direct(numel, 7.0f), default_out(numel, 7.0f);
  EXPECT_TRUE(codec.FinishGather(payloads, {}, absl::MakeSpan(direct)).ok());
  EXPECT_TRUE(codec
                  .SingleRoundCodec::FinishGather(payloads, {},
                                                  absl::MakeSpan(default_out))
                  .ok());
  for (size_t i = 0; i < numel; ++i) {
    EXPECT_EQ(std::memcmp(&direct[i], &default_out[i], sizeof(float)), 0)
        << "value " << i << ": " << direct[i] << " against the default's "
        << default_out[i];
  }
  return direct;
}

void ExpectGatherRefusedLikeTheDefault(const SingleRoundCodec& codec,
                                       absl::Span<const Bytes> payloads,
                                       size_t numel,
                                       absl::string_view message) {
  std::vector<float> out(numel, 7.0f);
  const std::vector<float> untouched = out;
  const absl::Status s = codec.FinishGather(payloads, {}, absl::MakeSpan(out));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(message), absl::string_view::npos) << s.message();
  EXPECT_EQ(out, untouched);
  std::vector<float> default_out = untouched;
  EXPECT_EQ(codec.SingleRoundCodec::FinishGather(payloads, {},
                                                 absl::MakeSpan(default_out)),
            s);
  EXPECT_EQ(codec.FinishGather({}, {}, absl::MakeSpan(out)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out, untouched);
}

}  // namespace gradcomp::codecs::testing
