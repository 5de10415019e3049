#include "service/engine/dtype.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradcomp::service {
namespace {

using ::testing::HasSubstr;

// Values exactly representable in fp16 and bf16, so every round trip is exact.
const std::vector<float> kExact = {0.0f, -0.0f, 1.0f, -2.5f, 0.125f, 96.0f};

TEST(DTypeTest, BytesAndNames) {
  EXPECT_EQ(*DTypeBytes(DType::kFloat32), 4u);
  EXPECT_EQ(*DTypeBytes(DType::kFloat16), 2u);
  EXPECT_EQ(*DTypeBytes(DType::kBFloat16), 2u);
  EXPECT_EQ(*DTypeBytes(DType::kFloat64), 8u);
  EXPECT_EQ(DTypeName(DType::kBFloat16), "bfloat16");
}

TEST(DTypeTest, UnknownDTypeIsRejectedWithTheAcceptedOnes) {
  absl::StatusOr<size_t> bytes = DTypeBytes(static_cast<DType>(42));
  ASSERT_EQ(bytes.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bytes.status().message(), HasSubstr("dtype(42)"));
  EXPECT_THAT(bytes.status().message(), HasSubstr("float32, float16"));
  EXPECT_FALSE(DTypeBytes(DType::kUnspecified).ok());
}

class RoundTripTest : public ::testing::TestWithParam<DType> {};

TEST_P(RoundTripTest, EncodeThenDecodeIsExactOnRepresentableValues) {
  absl::StatusOr<std::string> bytes = EncodeFromFloat(GetParam(), kExact);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(bytes->size(), kExact.size() * *DTypeBytes(GetParam()));
  std::vector<float> back(kExact.size());
  ASSERT_TRUE(DecodeToFloat(GetParam(), *bytes, absl::MakeSpan(back)).ok());
  for (size_t i = 0; i < kExact.size(); ++i) {
    EXPECT_EQ(back[i], kExact[i]) << "element " << i;
    EXPECT_EQ(std::signbit(back[i]), std::signbit(kExact[i]));
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, RoundTripTest,
                         ::testing::Values(DType::kFloat32, DType::kFloat16,
                                           DType::kBFloat16, DType::kFloat64));

TEST_P(RoundTripTest, EncodeIntoAnUnalignedBufferMatchesEncode) {
  const size_t size = kExact.size() * *DTypeBytes(GetParam());
  std::string buffer(size + 1, 'x');
  ASSERT_TRUE(EncodeFromFloatInto(GetParam(), kExact,
                                  absl::MakeSpan(buffer.data() + 1, size))
                  .ok());
  EXPECT_EQ(buffer[0], 'x');
  EXPECT_EQ(buffer.substr(1), *EncodeFromFloat(GetParam(), kExact));
}

TEST(DTypeTest, EncodeIntoChecksTheBufferSizeAndWritesNothingOnError) {
  std::string buffer(11, 'x');
  absl::Status s = EncodeFromFloatInto(
      DType::kFloat16, kExact, absl::MakeSpan(buffer.data(), buffer.size()));
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("output buffer has 11 bytes, expected 12"));
  EXPECT_EQ(buffer, std::string(11, 'x'));
}

TEST(DTypeTest, DecodeChecksTheByteCount) {
  std::vector<float> out(3);
  absl::Status s =
      DecodeToFloat(DType::kFloat16, std::string(5, '\0'), absl::MakeSpan(out));
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("data has 5 bytes, expected 6"));
}

TEST(DTypeTest, Float64BeyondFloatRangeSaturatesToInf) {
  const double in[3] = {1e300, -1e300, 0.5};
  std::string data(sizeof(in), '\0');
  std::memcpy(data.data(), in, sizeof(in));
  std::vector<float> out(3);
  ASSERT_TRUE(DecodeToFloat(DType::kFloat64, data, absl::MakeSpan(out)).ok());
  EXPECT_EQ(out[0], std::numeric_limits<float>::infinity());
  EXPECT_EQ(out[1], -std::numeric_limits<float>::infinity());
  EXPECT_EQ(out[2], 0.5f);
}

// The first magnitude that becomes Inf is that, and the float below it
// stays finite, with either sign.
TEST(DTypeTest, FirstMagnitudeToInfIsWhereEncodingOverflows) {
  for (const DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    const float limit = FirstMagnitudeToInf(dtype);
    const float below = std::nextafter(limit, 0.0f);
    const std::vector<float> in = {limit, -limit, below, -below};
    absl::StatusOr<std::string> data = EncodeFromFloat(dtype, in);
    ASSERT_TRUE(data.ok()) << data.status();
    std::vector<float> out(in.size());
    ASSERT_TRUE(DecodeToFloat(dtype, *data, absl::MakeSpan(out)).ok());
    EXPECT_EQ(out[0], std::numeric_limits<float>::infinity()) << limit;
    EXPECT_EQ(out[1], -std::numeric_limits<float>::infinity()) << limit;
    EXPECT_TRUE(std::isfinite(out[2]) && std::isfinite(out[3])) << below;
  }
  EXPECT_EQ(FirstMagnitudeToInf(DType::kFloat32),
            std::numeric_limits<float>::infinity());
  EXPECT_EQ(FirstMagnitudeToInf(DType::kFloat64),
            std::numeric_limits<float>::infinity());
}

TEST(DTypeTest, HalfPrecisionRoundsToNearestEven) {
  // fp16's ulp above 1 is 2^-10. Below half an ulp rounds down, above half
  // rounds up (truncation would give 1), and a tie goes to the even
  // mantissa: down from 1 + 2^-11, up from 1 + 2^-10 + 2^-11.
  constexpr float kUlp = 1.0f / 1024;
  const std::vector<float> in = {1.0f + kUlp / 4, 1.0f + 3 * kUlp / 4,
                                 1.0f + kUlp / 2, 1.0f + kUlp + kUlp / 2};
  std::vector<float> back(in.size());
  ASSERT_TRUE(DecodeToFloat(DType::kFloat16,
                            *EncodeFromFloat(DType::kFloat16, in),
                            absl::MakeSpan(back))
                  .ok());
  EXPECT_EQ(back,
            (std::vector<float>{1.0f, 1.0f + kUlp, 1.0f, 1.0f + 2 * kUlp}));
}

}  // namespace
}  // namespace gradcomp::service
