#include "service/engine/codec_cache.h"

#include "codecs/builtin.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradcomp::service {
namespace {

using ::testing::HasSubstr;

TEST(CodecCacheTest, SameSpecSharesOneInstance) {
  CodecCache cache(codecs::BuiltinCodecs());
  auto a = cache.Get({"fp16", {}});
  auto b = cache.Get({"fp16", {}});
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->get(), b->get());
  EXPECT_EQ((*a)->info().name, "fp16");
  auto c = cache.Get({"bf16", {}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_NE(a->get(), c->get());
  EXPECT_EQ(cache.size(), 2u);
}

TEST(CodecCacheTest, UnknownCodecIsInvalidArgumentAndNotCached) {
  CodecCache cache(codecs::BuiltinCodecs());
  auto codec = cache.Get({"zip", {}});
  ASSERT_EQ(codec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(codec.status().message(), HasSubstr("zip"));
  EXPECT_THAT(codec.status().message(), HasSubstr("none"));
  EXPECT_EQ(cache.size(), 0u);
}

TEST(CodecCacheTest, BadParameterIsInvalidArgument) {
  CodecCache cache(codecs::BuiltinCodecs());
  auto codec = cache.Get({"none", {{"ratoi", "0.1"}}});
  ASSERT_EQ(codec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(codec.status().message(), HasSubstr("ratoi"));
}

}  // namespace
}  // namespace gradcomp::service
