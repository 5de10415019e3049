#include "codecs/registry.h"

#include <memory>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradcomp::codecs {
namespace {

using ::testing::HasSubstr;

// A codec that does nothing; the registry only stores and returns it.
class NullCodec : public Codec {
 public:
  explicit NullCodec(CodecInfo info) : info_(std::move(info)) {}
  const CodecInfo& info() const override { return info_; }
  absl::StatusOr<std::unique_ptr<CodecSession>> Start(
      const TensorView&, TensorState&, const StepContext&) const override {
    return absl::UnimplementedError("NullCodec has no sessions");
  }

 private:
  CodecInfo info_;
};

CodecInfo Info(const std::string& name) {
  CodecInfo info;
  info.name = name;
  return info;
}

CodecFactory FactoryAsking(const std::string& name, const std::string& key) {
  return
      [name, key](
          const CodecParams& params) -> absl::StatusOr<std::unique_ptr<Codec>> {
        absl::StatusOr<double> v = params.GetDouble(key, 1.0);
        if (!v.ok()) return v.status();
        return std::unique_ptr<Codec>(std::make_unique<NullCodec>(Info(name)));
      };
}

TEST(CodecRegistryTest, CreatesRegisteredCodecs) {
  CodecRegistry registry;
  ASSERT_TRUE(registry.Register(Info("a"), FactoryAsking("a", "x")).ok());
  ASSERT_TRUE(registry.Register(Info("b"), FactoryAsking("b", "y")).ok());
  absl::StatusOr<std::unique_ptr<Codec>> codec =
      registry.Create("b", CodecParams({{"y", "2"}}));
  ASSERT_TRUE(codec.ok()) << codec.status();
  EXPECT_EQ((*codec)->info().name, "b");
  ASSERT_EQ(registry.List().size(), 2u);
  EXPECT_EQ(registry.List()[0].name, "a");
}

TEST(CodecRegistryTest, RejectsDuplicatesAndEmptyNames) {
  CodecRegistry registry;
  ASSERT_TRUE(registry.Register(Info("a"), FactoryAsking("a", "x")).ok());
  EXPECT_EQ(registry.Register(Info("a"), FactoryAsking("a", "x")).code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(registry.Register(Info(""), FactoryAsking("", "x")).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.Register(Info("c"), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CodecRegistryTest, UnknownNameListsKnownCodecs) {
  CodecRegistry registry;
  ASSERT_TRUE(registry.Register(Info("fp16"), FactoryAsking("fp16", "x")).ok());
  ASSERT_TRUE(registry.Register(Info("topk"), FactoryAsking("topk", "x")).ok());
  absl::StatusOr<std::unique_ptr<Codec>> codec =
      registry.Create("tpok", CodecParams());
  EXPECT_EQ(codec.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(codec.status().message(),
              HasSubstr("unknown codec 'tpok' (known: fp16, topk)"));
}

TEST(CodecRegistryTest, RejectsParametersTheFactoryDidNotAskFor) {
  CodecRegistry registry;
  ASSERT_TRUE(registry.Register(Info("a"), FactoryAsking("a", "ratio")).ok());
  absl::StatusOr<std::unique_ptr<Codec>> codec =
      registry.Create("a", CodecParams({{"ratoi", "0.1"}}));
  EXPECT_EQ(codec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(codec.status().message(), HasSubstr("'ratoi'"));
  // A bad value is the factory's error.
  codec = registry.Create("a", CodecParams({{"ratio", "abc"}}));
  EXPECT_EQ(codec.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace gradcomp::codecs
