#include "service/engine/tensor_list.h"

#include <algorithm>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradcomp::service {
namespace {

using ::testing::HasSubstr;

std::vector<TensorDecl> Model() {
  return {{"fc2.weight", DType::kFloat32, {10, 256}},
          {"fc1.weight", DType::kFloat32, {256, 784}},
          {"fc1.bias", DType::kFloat16, {256}}};
}

TEST(TensorListTest, SerialisesInNameOrderAndRoundTrips) {
  auto list = TensorList::Create(Model());
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(list->Serialize(),
            "fc1.bias\tfloat16\t256\nfc1.weight\tfloat32\t256,784\n"
            "fc2.weight\tfloat32\t10,256\n");
  auto parsed = TensorList::Parse(list->Serialize());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->Serialize(), list->Serialize());
  EXPECT_EQ(parsed->Hash(), list->Hash());
}

TEST(TensorListTest, OrderOfDeclarationDoesNotChangeTheHash) {
  std::vector<TensorDecl> reversed = Model();
  std::reverse(reversed.begin(), reversed.end());
  EXPECT_EQ(TensorList::Create(Model())->Hash(),
            TensorList::Create(reversed)->Hash());
  std::vector<TensorDecl> other = Model();
  other[0].shape = {10, 257};
  EXPECT_NE(TensorList::Create(Model())->Hash(),
            TensorList::Create(other)->Hash());
}

TEST(TensorListTest, RejectsBadDeclarations) {
  EXPECT_THAT(TensorList::Create({}).status().message(), HasSubstr("empty"));
  std::vector<TensorDecl> twice = Model();
  twice.push_back(twice[0]);
  EXPECT_THAT(TensorList::Create(twice).status().message(),
              HasSubstr("'fc2.weight' is declared twice"));
  EXPECT_THAT(
      TensorList::Create({{"a\tb", DType::kFloat32, {1}}}).status().message(),
      HasSubstr("control character"));
  EXPECT_THAT(
      TensorList::Create({{"a", DType::kFloat32, {-1}}}).status().message(),
      HasSubstr("expected dimensions >= 0"));
  EXPECT_FALSE(TensorList::Create({{"a", DType::kUnspecified, {1}}}).ok());
  EXPECT_THAT(TensorList::Parse("a\tint7\t1\n").status().message(),
              HasSubstr("unknown dtype 'int7'"));
  EXPECT_THAT(TensorList::Parse("a\tfloat32\n").status().message(),
              HasSubstr("expected 3"));
}

TEST(TensorListTest, CompareNamesBothRanksAndTheDifference) {
  std::vector<TensorList> lists;
  for (int r = 0; r < 3; ++r) lists.push_back(*TensorList::Create(Model()));
  EXPECT_TRUE(CompareTensorLists(lists).ok());

  std::vector<TensorDecl> shape = Model();
  shape[1].shape = {256, 785};
  lists[2] = *TensorList::Create(shape);
  absl::Status status = CompareTensorLists(lists);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(),
              HasSubstr("rank 0 declares 'fc1.weight' float32 [256,784] but "
                        "rank 2 declares float32 [256,785]"));

  std::vector<TensorDecl> missing = Model();
  missing.pop_back();
  lists[2] = *TensorList::Create(missing);
  EXPECT_THAT(CompareTensorLists(lists).message(),
              HasSubstr("rank 0 declares 'fc1.bias' float16 [256] but rank 2 "
                        "does not declare it"));

  std::vector<TensorDecl> extra = Model();
  extra.push_back({"fc3.weight", DType::kFloat32, {2, 2}});
  lists[2] = *TensorList::Create(extra);
  EXPECT_THAT(CompareTensorLists(lists).message(),
              HasSubstr("rank 2 declares 'fc3.weight' float32 [2,2] but rank "
                        "0 does not declare it"));
}

TEST(DeclaredTensorsTest, ChecksOnlyDeclaredJobs) {
  DeclaredTensors declared;
  EXPECT_TRUE(declared.Check("job", "anything", DType::kFloat32, {3}).ok());
  declared.Set("job", *TensorList::Create(Model()));
  EXPECT_TRUE(
      declared.Check("job", "fc1.weight", DType::kFloat32, {256, 784}).ok());
  EXPECT_TRUE(declared.Check("other", "x", DType::kFloat32, {1}).ok());
  EXPECT_THAT(
      declared.Check("job", "fc9.weight", DType::kFloat32, {1}).message(),
      HasSubstr("'fc9.weight' is not in job 'job''s declared list of 3"));
  EXPECT_THAT(declared.Check("job", "fc1.weight", DType::kFloat32, {784, 256})
                  .message(),
              HasSubstr("is float32 [784,256], expected float32 [256,784] as "
                        "declared"));
  EXPECT_THAT(
      declared.Check("job", "fc1.bias", DType::kFloat32, {256}).message(),
      HasSubstr("expected float16 [256]"));
}

}  // namespace
}  // namespace gradcomp::service
