#include "codecs/testing/gather_checks.h"

#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace gradcomp::codecs::testing {

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
