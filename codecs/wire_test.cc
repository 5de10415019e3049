#include "codecs/wire.h"

#include <cstring>
#include <string>
#include <vector>

#include "codecs/cpu/half.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradcomp::codecs {
namespace {

using ::testing::HasSubstr;

WireHeader Header(CodecId codec, uint8_t round, uint64_t numel,
                  uint8_t flags = 0) {
  WireHeader h;
  h.codec = codec;
  h.round = round;
  h.numel = numel;
  h.flags = flags;
  return h;
}

void PutLe(Bytes& b, size_t offset, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i)
    b[offset + i] = static_cast<char>(v >> (8 * i));
}

absl::Status ParseStatus(absl::string_view payload,
                         CodecId codec = CodecId::kTopK, uint8_t round = 2,
                         uint64_t numel = 1000) {
  return ParsePayload(payload, codec, round, numel).status();
}

// A valid top-k payload: 3 parameter bytes, 5 body bytes.
Bytes Sample() {
  Bytes out;
  WritePayload(Header(CodecId::kTopK, 2, 1000), "abc", "hello", &out);
  return out;
}

TEST(WireTest, HeaderLayoutIsTheDocumentedOne) {
  const Bytes p = Sample();
  ASSERT_EQ(p.size(), 32u + 3 + 5);
  EXPECT_EQ(p.substr(0, 4), "GCMP");
  EXPECT_EQ(p[4], kWireVersion);
  EXPECT_EQ(p[5], 4);  // topk
  EXPECT_EQ(p[6], 2);  // round
  EXPECT_EQ(p[7], 0);  // flags
  EXPECT_EQ(p.substr(8, 8), std::string("\xe8\x03\0\0\0\0\0\0", 8));
  EXPECT_EQ(p.substr(16, 4), std::string("\x03\0\0\0", 4));
  EXPECT_EQ(p.substr(20, 4), std::string(4, '\0'));
  EXPECT_EQ(p.substr(24, 8), std::string("\x05\0\0\0\0\0\0\0", 8));
  EXPECT_EQ(p.substr(32), "abchello");
}

TEST(WireTest, ParseReturnsViewsOfParamsAndBody) {
  const Bytes p = Sample();
  absl::StatusOr<ParsedPayload> parsed =
      ParsePayload(p, CodecId::kTopK, 2, 1000);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->header.codec, CodecId::kTopK);
  EXPECT_EQ(parsed->header.round, 2);
  EXPECT_EQ(parsed->header.numel, 1000u);
  EXPECT_EQ(parsed->params, "abc");
  EXPECT_EQ(parsed->body, "hello");
  EXPECT_EQ(parsed->body.data(), p.data() + 35);
  ASSERT_TRUE(PeekPayload(p).ok());
}

TEST(WireTest, BeginPayloadReturnsTheBodyStart) {
  Bytes out = "left over";
  char* body = BeginPayload(Header(CodecId::kQsgd, 0, 4), "pp", 4, &out);
  std::memcpy(body, "wxyz", 4);
  absl::StatusOr<ParsedPayload> parsed =
      ParsePayload(out, CodecId::kQsgd, 0, 4);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->params, "pp");
  EXPECT_EQ(parsed->body, "wxyz");
}

TEST(WireTest, BeginPayloadForAppendLeavesRoomForTheBody) {
  Bytes out = "left over";
  BeginPayloadForAppend(Header(CodecId::kQsgd, 0, 4), "pp", 4, &out);
  EXPECT_EQ(out.size(), 32u + 2);
  EXPECT_GE(out.capacity(), 32u + 2 + 4);
  out.append("wxyz");
  Bytes written;
  BeginPayload(Header(CodecId::kQsgd, 0, 4), "pp", 4, &written);
  std::memcpy(written.data() + 34, "wxyz", 4);
  EXPECT_EQ(out, written);
}

// Appended in chunks through a buffer, the values are the whole-span
// conversions, also past a chunk boundary and for a ragged tail.
TEST(WireTest, AppendDenseValuesMatchesTheWholeConversion) {
  std::vector<float> values(4096 * 2 + 37);
  for (size_t i = 0; i < values.size(); ++i) {
    values[i] = 0.37f * static_cast<float>(i) - 1000.0f;
  }
  const float scale = 1.0f / 3.0f;
  for (const ElemType type :
       {ElemType::kF32, ElemType::kF16, ElemType::kBF16}) {
    Bytes expected(values.size() * ElemTypeBytes(type), '\0');
    switch (type) {
      case ElemType::kF32:
        ScaleFloat(values, scale, expected.data());
        break;
      case ElemType::kF16:
        FloatToHalf(values, scale, expected.data());
        break;
      case ElemType::kBF16:
        FloatToBf16(values, scale, expected.data());
        break;
    }
    Bytes out = "head";
    AppendDenseValues(type, values, scale, &out);
    EXPECT_EQ(out, "head" + expected) << static_cast<int>(type);
  }
  Bytes same;
  AppendDenseValues(ElemType::kF32, values, 1.0f, &same);
  ASSERT_EQ(same.size(), values.size() * sizeof(float));
  EXPECT_EQ(std::memcmp(same.data(), values.data(), same.size()), 0);
}

TEST(WireTest, PayloadHeadPlusBodyIsTheWrittenPayload) {
  Bytes whole;
  WritePayload(Header(CodecId::kNone, 1, 9), "p", "bodybytes", &whole);
  EXPECT_EQ(PayloadHead(Header(CodecId::kNone, 1, 9), "p", 9) + "bodybytes",
            whole);
}

TEST(WireTest, RejectsEveryTruncation) {
  const Bytes p = Sample();
  for (size_t len = 0; len < p.size(); ++len) {
    EXPECT_EQ(ParseStatus(absl::string_view(p).substr(0, len)).code(),
              absl::StatusCode::kInvalidArgument)
        << len;
  }
  EXPECT_THAT(ParseStatus("GCMP").message(),
              HasSubstr("expected at least 32 header bytes, got 4"));
}

TEST(WireTest, RejectsAppendedBytes) {
  EXPECT_THAT(ParseStatus(Sample() + "x").message(),
              HasSubstr("expected body of 6 bytes"));
}

TEST(WireTest, RejectsBadMagicVersionFlagsAndReserved) {
  Bytes p = Sample();
  p[0] = 'X';
  EXPECT_THAT(ParseStatus(p).message(), HasSubstr("expected magic"));
  p = Sample();
  p[4] = 2;
  EXPECT_THAT(ParseStatus(p).message(),
              HasSubstr("expected wire format version 1, got 2"));
  p = Sample();
  p[7] = 0x02;
  EXPECT_THAT(ParseStatus(p).message(),
              HasSubstr("expected flags within 0x01, got 0x02"));
  p = Sample();
  p[23] = 1;
  EXPECT_THAT(ParseStatus(p).message(), HasSubstr("reserved"));
  p = Sample();
  p[5] = 0;
  EXPECT_THAT(ParseStatus(p).message(), HasSubstr("unknown codec id 0"));
  p[5] = static_cast<char>(200);
  EXPECT_THAT(ParseStatus(p).message(), HasSubstr("unknown codec id 200"));
}

TEST(WireTest, RejectsLengthFieldsThatDoNotAddUp) {
  Bytes p = Sample();
  PutLe(p, 16, 9, 4);  // parameter block longer than what follows the header
  EXPECT_THAT(ParseStatus(p).message(),
              HasSubstr("parameter block of 9 bytes exceeds the 8 bytes"));
  p = Sample();
  PutLe(p, 16, 0xFFFFFFFF, 4);
  EXPECT_EQ(ParseStatus(p).code(), absl::StatusCode::kInvalidArgument);
  p = Sample();
  PutLe(p, 24, 4, 8);  // body shorter than the payload holds
  EXPECT_THAT(ParseStatus(p).message(), HasSubstr("expected body of 5 bytes"));
  // Lengths whose sum would wrap around 2^64 must not pass.
  p = Sample();
  PutLe(p, 24, ~uint64_t{0} - 34, 8);
  EXPECT_EQ(ParseStatus(p).code(), absl::StatusCode::kInvalidArgument);
}

TEST(WireTest, RejectsUnexpectedCodecRoundAndNumel) {
  const Bytes p = Sample();
  EXPECT_THAT(ParseStatus(p, CodecId::kFp16).message(),
              HasSubstr("payload: expected codec 'fp16' (2), got 'topk' (4)"));
  EXPECT_THAT(ParseStatus(p, CodecId::kTopK, 0).message(),
              HasSubstr("expected round 0, got 2"));
  EXPECT_THAT(ParseStatus(p, CodecId::kTopK, 2, 999).message(),
              HasSubstr("expected 999 elements, got 1000"));
}

TEST(WireTest, DensePayloadsRoundTripEveryElementType) {
  const std::vector<float> values = {1.0f, -2.5f, 0.0f, 65504.0f, 3.0e-5f,
                                     7.0f, 8.0f,  9.0f, 10.0f,    -11.0f};
  for (ElemType type : {ElemType::kF32, ElemType::kF16, ElemType::kBF16}) {
    Bytes p;
    WriteDensePayload(Header(CodecId::kRandomK, 1, values.size()), type, values,
                      &p);
    absl::StatusOr<ParsedPayload> parsed =
        ParsePayload(p, CodecId::kRandomK, 1, values.size());
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(parsed->header.flags, kFlagDenseBody);
    EXPECT_EQ(parsed->params, std::string(1, static_cast<char>(type)));
    EXPECT_EQ(parsed->body.size(), values.size() * ElemTypeBytes(type));
    std::vector<float> acc(values.size(), 1.0f);
    ASSERT_TRUE(AddDenseBody(*parsed, 2.0f, absl::MakeSpan(acc)).ok());
    for (size_t i = 0; i < values.size(); ++i) {
      float decoded = values[i];
      if (type == ElemType::kF16)
        decoded = HalfBitsToFloat(FloatToHalfBits(decoded));
      if (type == ElemType::kBF16)
        decoded = Bf16BitsToFloat(FloatToBf16Bits(decoded));
      EXPECT_EQ(acc[i], 1.0f + 2.0f * decoded) << i;
    }
  }
}

TEST(WireTest, RejectsMalformedDenseBodies) {
  const std::vector<float> values(8, 1.0f);
  Bytes p;
  WriteDensePayload(Header(CodecId::kNone, 0, 8), ElemType::kF16, values, &p);
  Bytes bad = p;
  bad[32] = 7;  // element type
  EXPECT_THAT(ParseStatus(bad, CodecId::kNone, 0, 8).message(),
              HasSubstr("expected dense element type"));
  bad = p;
  bad.pop_back();  // half an fp16 element
  PutLe(bad, 24, 15, 8);
  EXPECT_THAT(
      ParseStatus(bad, CodecId::kNone, 0, 8).message(),
      HasSubstr("expected a dense body of whole 2-byte elements, got 15"));
  Bytes no_params;
  WritePayload(Header(CodecId::kNone, 0, 0, kFlagDenseBody), "", "",
               &no_params);
  EXPECT_THAT(PeekPayload(no_params).status().message(),
              HasSubstr("expected an element type"));
}

TEST(WireTest, AddDenseBodyChecksFlagAndSizeAndLeavesAccOnError) {
  const std::vector<float> values(4, 1.0f);
  Bytes p;
  WriteDensePayload(Header(CodecId::kNone, 0, 4), ElemType::kF32, values, &p);
  ParsedPayload parsed = *PeekPayload(p);
  std::vector<float> acc(5, 3.0f);
  EXPECT_THAT(
      AddDenseBody(parsed, 1.0f, absl::MakeSpan(acc)).message(),
      HasSubstr("expected a dense body of 5 elements of 4 bytes, got 16"));
  EXPECT_EQ(acc, std::vector<float>(5, 3.0f));
  // A summable codec's body may hold fewer values than the tensor.
  Bytes k_values;
  WriteDensePayload(Header(CodecId::kRandomK, 0, 1000), ElemType::kF32, values,
                    &k_values);
  ParsedPayload randomk = *ParsePayload(k_values, CodecId::kRandomK, 0, 1000);
  std::vector<float> four(4, 0.0f);
  EXPECT_TRUE(AddDenseBody(randomk, 1.0f, absl::MakeSpan(four)).ok());
  EXPECT_EQ(four, values);
  const ParsedPayload sparse = *PeekPayload(Sample());
  std::vector<float> acc1000(1000, 0.0f);
  EXPECT_THAT(AddDenseBody(sparse, 1.0f, absl::MakeSpan(acc1000)).message(),
              HasSubstr("expected a dense body"));
}

}  // namespace
}  // namespace gradcomp::codecs
