#include "codecs/builtin.h"

#include <set>
#include <string>

#include "gtest/gtest.h"

namespace gradcomp::codecs {
namespace {

TEST(BuiltinCodecsTest, HoldsTheDenseCodecsWithDistinctIds) {
  const CodecRegistry& registry = BuiltinCodecs();
  EXPECT_EQ(&registry, &BuiltinCodecs());
  std::set<std::string> names;
  std::set<CodecId> ids;
  for (const CodecInfo& info : registry.List()) {
    names.insert(info.name);
    EXPECT_TRUE(ids.insert(info.id).second) << info.name << " reuses an id";
    if (info.family == "dense") {
      EXPECT_TRUE(info.summable) << info.name;
    }
  }
  for (const char* name : {"none", "fp16", "bf16"}) {
    EXPECT_EQ(names.count(name), 1u) << name;
    EXPECT_TRUE(registry.Create(name, CodecParams()).ok()) << name;
  }
}

}  // namespace
}  // namespace gradcomp::codecs
