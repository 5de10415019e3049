#include "codecs/cpu/dense.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "codecs/codec.h"
#include "codecs/cpu/half.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradcomp::codecs {
namespace {

using ::testing::HasSubstr;

class DenseTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(RegisterDenseCodecs(registry_).ok()); }

  std::unique_ptr<SingleRoundCodec> Make(const std::string& name,
                                         const CodecParams& params = {}) {
    absl::StatusOr<std::unique_ptr<Codec>> codec =
        registry_.Create(name, params);
    EXPECT_TRUE(codec.ok()) << codec.status();
    if (!codec.ok()) return nullptr;
    return std::unique_ptr<SingleRoundCodec>(
        dynamic_cast<SingleRoundCodec*>(codec->release()));
  }

  Bytes Encode(const SingleRoundCodec& codec, const std::vector<float>& g,
               int world_size = 1) {
    const std::vector<int64_t> shape = {static_cast<int64_t>(g.size())};
    StepContext ctx;
    ctx.world_size = world_size;
    Bytes payload;
    EXPECT_TRUE(codec.Encode({g, shape}, state_, ctx, &payload).ok());
    return payload;
  }

  CodecRegistry registry_;
  TensorState state_;
};

TEST_F(DenseTest, RegistersThreeSummableCodecs) {
  ASSERT_EQ(registry_.List().size(), 3u);
  for (const CodecInfo& info : registry_.List()) {
    EXPECT_TRUE(info.summable);
    EXPECT_FALSE(info.stateful);
    EXPECT_EQ(info.family, "dense");
    EXPECT_EQ(info.params, std::vector<std::string>({"prescale"}));
  }
  EXPECT_EQ(RegisterDenseCodecs(registry_).code(),
            absl::StatusCode::kAlreadyExists);
}

TEST_F(DenseTest, RejectsUnknownAndBadParameters) {
  EXPECT_THAT(
      registry_.Create("fp16", {{"prescal", "true"}}).status().message(),
      HasSubstr("unknown parameter 'prescal' for codec 'fp16'"));
  EXPECT_EQ(registry_.Create("bf16", {{"prescale", "perhaps"}}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(DenseTest, Fp16PayloadIsHeaderParamsAndHalfBody) {
  auto codec = Make("fp16");
  const std::vector<float> g = {1.0f, -2.0f, 0.1f};
  const Bytes p = Encode(*codec, g);
  ASSERT_EQ(p.size(), 32u + 8 + 6);
  EXPECT_EQ(p[5], static_cast<char>(CodecId::kFp16));
  EXPECT_EQ(p[7], kFlagDenseBody);
  EXPECT_EQ(p.substr(32, 8), std::string("\x02\0\0\0\x01\0\0\0", 8));
  char body[6];
  FloatToHalf(g, 1.0f, body);
  EXPECT_EQ(p.substr(40), std::string(body, 6));
}

TEST_F(DenseTest, ParseNamesTheDivisorAndBody) {
  const Bytes p = Encode(*Make("bf16", {{"prescale", "true"}}), {1, 2, 3},
                         /*world_size=*/4);
  const absl::StatusOr<DensePayload> parsed =
      ParseDensePayload(p, ElemType::kBF16, 3);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->divisor, 4u);
  EXPECT_EQ(parsed->body, absl::string_view(p).substr(kWireHeaderBytes + 8));
  EXPECT_THAT(ParseDensePayload(p, ElemType::kF16, 3).status().message(),
              HasSubstr("expected codec 'fp16' (2), got 'bf16' (3)"));
  EXPECT_EQ(ParseDensePayload(p, ElemType::kBF16, 4).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(DenseTest, NoneIsExactAndHalfFormatsRoundToNearest) {
  const std::vector<float> g = {1.0f, -2.5f, 0.1f, 1e-3f, 3.14159f, 1e-8f};
  for (const char* name : {"none", "fp16", "bf16"}) {
    auto codec = Make(name);
    const Bytes p = Encode(*codec, g);
    std::vector<float> out(g.size(), 0.0f);
    ASSERT_TRUE(codec->DecodeAdd(p, 1.0f, absl::MakeSpan(out)).ok());
    for (size_t i = 0; i < g.size(); ++i) {
      float expected = g[i];
      if (std::string(name) == "fp16")
        expected = HalfBitsToFloat(FloatToHalfBits(g[i]));
      if (std::string(name) == "bf16")
        expected = Bf16BitsToFloat(FloatToBf16Bits(g[i]));
      EXPECT_EQ(out[i], expected) << name << " " << i;
    }
  }
}

TEST_F(DenseTest, NanAndInfPassThrough) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> g = {std::nanf(""), inf, -inf, 1.0f};
  for (const char* name : {"none", "fp16", "bf16"}) {
    auto codec = Make(name);
    std::vector<float> out(g.size(), 0.0f);
    ASSERT_TRUE(
        codec->DecodeAdd(Encode(*codec, g), 1.0f, absl::MakeSpan(out)).ok());
    EXPECT_TRUE(std::isnan(out[0])) << name;
    EXPECT_EQ(out[1], inf) << name;
    EXPECT_EQ(out[2], -inf) << name;
    EXPECT_EQ(out[3], 1.0f) << name;
  }
  // fp16 has no values above 65504: they become infinity, visibly.
  auto fp16 = Make("fp16");
  std::vector<float> out(1, 0.0f);
  ASSERT_TRUE(
      fp16->DecodeAdd(Encode(*fp16, {70000.0f}), 1.0f, absl::MakeSpan(out))
          .ok());
  EXPECT_EQ(out[0], inf);
}

TEST_F(DenseTest, PrescaleDividesBeforeTheCastAndTheSumIsTheAverage) {
  // Four workers at 60000: in fp16 each fits but any partial sum would not.
  constexpr int kWorld = 4;
  auto codec = Make("fp16", {{"prescale", "true"}});
  const std::vector<float> g = {60000.0f, -60000.0f, 3.0f};
  const Bytes p = Encode(*codec, g, kWorld);
  EXPECT_EQ(p.substr(36, 4), std::string("\x04\0\0\0", 4));  // the divisor
  std::vector<float> body(3);
  HalfToFloat(p.data() + 40, absl::MakeSpan(body));
  EXPECT_EQ(body[0], 15000.0f);
  EXPECT_EQ(body[2], 0.75f);
  // DecodeOwn restores the scale.
  std::vector<float> own(3, 0.0f);
  ASSERT_TRUE(codec->DecodeAdd(p, 1.0f, absl::MakeSpan(own)).ok());
  EXPECT_EQ(own, g);
  // The sum of the bodies of W identical workers is already the average.
  StepContext ctx;
  ctx.world_size = kWorld;
  std::vector<float> sum = {4 * body[0], 4 * body[1], 4 * body[2]};
  std::vector<float> out(3);
  ASSERT_TRUE(codec->FinishSum(sum, kWorld, ctx, absl::MakeSpan(out)).ok());
  EXPECT_EQ(out, g);
  EXPECT_EQ(codec->FinishSum(sum, 3, ctx, absl::MakeSpan(out)).code(),
            absl::StatusCode::kInvalidArgument);
  // Without prescale the sum is divided at the end.
  auto plain = Make("fp16");
  ASSERT_TRUE(
      plain->FinishSum({8.0f, 4.0f, 2.0f}, kWorld, ctx, absl::MakeSpan(out))
          .ok());
  EXPECT_EQ(out, std::vector<float>({2.0f, 1.0f, 0.5f}));
}

TEST_F(DenseTest, FinishSumInPlaceGivesTheSameAverage) {
  StepContext ctx;
  ctx.world_size = 4;
  for (const CodecParams& params :
       {CodecParams{}, CodecParams({{"prescale", "true"}})}) {
    auto codec = Make("none", params);
    ASSERT_TRUE(codec->FinishSumInPlace());
    std::vector<float> sum = {8.0f, 4.0f, 2.0f, -1.0f, 3.0f};
    std::vector<float> out(sum.size());
    ASSERT_TRUE(codec->FinishSum(sum, 4, ctx, absl::MakeSpan(out)).ok());
    ASSERT_TRUE(codec->FinishSum(sum, 4, ctx, absl::MakeSpan(sum)).ok());
    EXPECT_EQ(sum, out);
  }
}

TEST_F(DenseTest, DecodeRejectsBadParameterBlocksAndLeavesAccUntouched) {
  auto codec = Make("bf16");
  const Bytes good = Encode(*codec, {1.0f, 2.0f});
  std::vector<float> acc = {5.0f, 5.0f};
  auto rejects = [&](Bytes p, const std::string& needle) {
    absl::Status s = codec->DecodeAdd(p, 1.0f, absl::MakeSpan(acc));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << needle;
    EXPECT_THAT(s.message(), HasSubstr(needle));
    EXPECT_EQ(acc, std::vector<float>({5.0f, 5.0f}));
  };
  Bytes p = good;
  p[32] = static_cast<char>(ElemType::kF16);
  // A body of the other 2-byte type has a valid shape, so only the codec's
  // own check catches it.
  rejects(p, "expected element type 3, got 2");
  p = good;
  p[33] = 1;
  rejects(p, "reserved parameter bytes");
  p = good;
  std::memset(&p[36], 0, 4);
  rejects(p, "divisor >= 1, got 0");
  rejects(Encode(*Make("fp16"), {1.0f, 2.0f}),
          "expected codec 'bf16' (3), got 'fp16' (2)");
  std::vector<float> wrong(3, 0.0f);
  EXPECT_THAT(codec->DecodeAdd(good, 1.0f, absl::MakeSpan(wrong)).message(),
              HasSubstr("expected 3 elements, got 2"));
}

}  // namespace
}  // namespace gradcomp::codecs
