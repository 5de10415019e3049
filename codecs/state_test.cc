#include "codecs/state.h"

#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradcomp::codecs {
namespace {

using ::testing::HasSubstr;

const std::vector<int64_t> kShape = {2, 3};

TEST(TensorStateTest, BuffersStartZeroAndResetOnResize) {
  TensorState state;
  EXPECT_FALSE(state.Find("ef.residual").has_value());
  absl::Span<float> b = state.Buffer("ef.residual", 4);
  EXPECT_EQ(b.size(), 4u);
  for (float v : b) EXPECT_EQ(v, 0.0f);
  b[1] = 5.0f;
  EXPECT_EQ(state.Buffer("ef.residual", 4)[1], 5.0f);
  ASSERT_TRUE(state.Find("ef.residual").has_value());
  EXPECT_EQ((*state.Find("ef.residual"))[1], 5.0f);
  EXPECT_EQ(state.ByteSize(), 16u);
  EXPECT_EQ(state.Buffer("ef.residual", 6)[1], 0.0f);
  state.Clear();
  EXPECT_EQ(state.ByteSize(), 0u);
}

TEST(StateStoreTest, KeepsStatePerJobAndTensor) {
  StateStore store;
  {
    StateStore::Locked s = store.Acquire("job", "w", kShape, 1);
    s->Buffer("x", 2)[0] = 1.0f;
  }
  {
    StateStore::Locked s = store.Acquire("job", "w", kShape, 1);
    EXPECT_EQ(s->Buffer("x", 2)[0], 1.0f);
  }
  EXPECT_FALSE(store.Acquire("other", "w", kShape, 1)->Find("x").has_value());
  EXPECT_FALSE(store.Acquire("job", "v", kShape, 1)->Find("x").has_value());
  EXPECT_EQ(store.resets(), 0u);
  EXPECT_EQ(store.ByteSize(), 8u);
}

// The daemon's metrics read ByteSize() while tensors sit locked in a
// collective that may wait for minutes: it must not take their locks.
TEST(StateStoreTest, ByteSizeDoesNotWaitForLockedTensors) {
  StateStore store;
  const int64_t shape[] = {4};
  {
    StateStore::Locked held = store.Acquire("job", "w", shape, 1);
    held->Buffer("ef.residual", 4);
    EXPECT_EQ(store.ByteSize(), 0u);  // published when the lock is released
  }
  EXPECT_EQ(store.ByteSize(), 16u);
  StateStore::Locked held = store.Acquire("job", "w", shape, 1);
  EXPECT_EQ(store.ByteSize(), 16u);
}

TEST(StateStoreTest, ByteSizeOfCountsTheNamedTensorsOfTheJobThatExist) {
  StateStore store;
  const int64_t shape[] = {4};
  store.Acquire("job", "a", shape, 1)->Buffer("ef.residual", 4);
  store.Acquire("job", "b", shape, 1)->Buffer("ef.residual", 2);
  store.Acquire("other", "a", shape, 1)->Buffer("ef.residual", 1);
  EXPECT_EQ(store.ByteSizeOf("job", {"a"}), 16u);
  EXPECT_EQ(store.ByteSizeOf("job", {"a", "b", "missing"}), 24u);
  EXPECT_EQ(store.ByteSizeOf("other", {"a", "b"}), 4u);
  // As ByteSize(): a locked tensor counts what it held at its last unlock.
  StateStore::Locked held = store.Acquire("job", "b", shape, 1);
  held->Buffer("ef.more", 4);
  EXPECT_EQ(store.ByteSizeOf("job", {"b"}), 8u);
}

TEST(StateStoreTest, EraseJobForgetsThatJobOnly) {
  StateStore store;
  store.Acquire("job", "w", kShape, 1)->Buffer("x", 2)[0] = 1.0f;
  store.Acquire("job", "v", kShape, 1)->Buffer("x", 2);
  // A job whose name starts with the other's is another job.
  store.Acquire("job2", "w", kShape, 1)->Buffer("x", 2)[0] = 2.0f;
  EXPECT_EQ(store.EraseJob("job"), 2u);
  EXPECT_EQ(store.ByteSize(), 8u);
  EXPECT_FALSE(store.Acquire("job", "w", kShape, 1)->Find("x").has_value());
  EXPECT_EQ(store.Acquire("job2", "w", kShape, 1)->Buffer("x", 2)[0], 2.0f);
  EXPECT_EQ(store.EraseJob("absent"), 0u);
}

// A tensor still locked when its job is erased keeps a valid state until
// it is released, and the store no longer counts it.
TEST(StateStoreTest, EraseJobLeavesAHeldLockValid) {
  StateStore store;
  StateStore::Locked held = store.Acquire("job", "w", kShape, 1);
  EXPECT_EQ(store.EraseJob("job"), 1u);
  held->Buffer("x", 2)[1] = 3.0f;
  EXPECT_EQ(held->Buffer("x", 2)[1], 3.0f);
  EXPECT_EQ(store.ByteSize(), 0u);
}

TEST(StateStoreTest, ShapeOrDtypeChangeResetsAndCounts) {
  StateStore store;
  store.Acquire("job", "w", kShape, 1)->Buffer("x", 2)[0] = 1.0f;
  EXPECT_FALSE(store.Acquire("job", "w", {3, 2}, 1)->Find("x").has_value());
  EXPECT_EQ(store.resets(), 1u);
  store.Acquire("job", "w", {3, 2}, 1)->Buffer("x", 2)[0] = 1.0f;
  EXPECT_FALSE(store.Acquire("job", "w", {3, 2}, 2)->Find("x").has_value());
  EXPECT_EQ(store.resets(), 2u);
}

// Another codec's buffers go (topk's momenta under qsgd would hold memory
// for ever, and come back stale if topk did); no owner (a dense step)
// keeps them for the owner after it.
TEST(StateStoreTest, AnotherOwnerResetsAndNoOwnerKeeps) {
  StateStore store;
  store.Acquire("job", "w", kShape, 1, "topk")->Buffer("dgc.v", 2)[0] = 1.0f;
  EXPECT_TRUE(store.Acquire("job", "w", kShape, 1)->Find("dgc.v").has_value());
  EXPECT_TRUE(
      store.Acquire("job", "w", kShape, 1, "topk")->Find("dgc.v").has_value());
  EXPECT_EQ(store.resets(), 0u);
  EXPECT_FALSE(
      store.Acquire("job", "w", kShape, 1, "qsgd")->Find("dgc.v").has_value());
  EXPECT_EQ(store.resets(), 1u);
  EXPECT_FALSE(
      store.Acquire("job", "w", kShape, 1, "topk")->Find("dgc.v").has_value());
  EXPECT_EQ(store.resets(), 2u);
  EXPECT_EQ(store.ByteSize(), 0u);
}

// Imported state has no owner: the first codec to use it keeps it.
TEST(StateStoreTest, ImportedStateGoesToItsFirstOwner) {
  StateStore source;
  source.Acquire("job", "w", kShape, 1, "topk")->Buffer("dgc.v", 2)[1] = 3.0f;
  absl::StatusOr<Bytes> blob = source.Export("job");
  ASSERT_TRUE(blob.ok()) << blob.status();
  StateStore target;
  target.Acquire("job", "w", kShape, 1, "qsgd");
  ASSERT_TRUE(target.Import("job", *blob).ok());
  EXPECT_EQ((*target.Acquire("job", "w", kShape, 1, "topk")->Find("dgc.v"))[1],
            3.0f);
  EXPECT_EQ(target.resets(), 0u);
}

TEST(StateStoreTest, LockedIsExclusive) {
  StateStore store;
  constexpr int kThreads = 4, kIncrements = 2000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kIncrements; ++i) {
        StateStore::Locked s = store.Acquire("job", "w", kShape, 1);
        // A read-modify-write that would lose updates without the lock.
        float& v = s->Buffer("count", 1)[0];
        const float old = v;
        std::this_thread::yield();
        v = old + 1.0f;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(store.Acquire("job", "w", kShape, 1)->Buffer("count", 1)[0],
            static_cast<float>(kThreads * kIncrements));
}

TEST(StateStoreTest, MoveAssignmentReleasesTheOldLock) {
  StateStore store;
  StateStore::Locked a = store.Acquire("job", "a", kShape, 1);
  a->Buffer("x", 1)[0] = 2.0f;
  a = store.Acquire("job", "b", kShape, 1);
  // "a" must be free again (a leaked lock would hang this thread). Another
  // thread takes it, as locking it here while holding "b" would invert the
  // lock order just used.
  float seen = 0.0f;
  std::thread other(
      [&] { seen = store.Acquire("job", "a", kShape, 1)->Buffer("x", 1)[0]; });
  other.join();
  EXPECT_EQ(seen, 2.0f);
}

void Fill(StateStore& store) {
  {
    StateStore::Locked s = store.Acquire("job", "fc1.weight", {2, 2}, 1);
    absl::Span<float> r = s->Buffer("ef.residual", 4);
    for (int i = 0; i < 4; ++i) r[i] = 0.5f * i - 1.0f;
    s->Buffer("dgc.momentum", 3)[2] = 7.0f;
  }
  store.Acquire("job", "bias", {5}, 1)->Buffer("ef.residual", 5)[4] = -3.0f;
  store.Acquire("other", "fc1.weight", {2, 2}, 1)->Buffer("x", 1)[0] = 9.0f;
}

TEST(StateStoreTest, ExportImportRoundTripsOneJob) {
  StateStore source;
  Fill(source);
  absl::StatusOr<Bytes> blob = source.Export("job");
  ASSERT_TRUE(blob.ok()) << blob.status();
  EXPECT_EQ(blob->substr(0, 4), "GCST");
  StateStore target;
  ASSERT_TRUE(target.Import("restored", *blob).ok());
  {
    StateStore::Locked s = target.Acquire("restored", "fc1.weight", {2, 2}, 1);
    ASSERT_TRUE(s->Find("ef.residual").has_value());
    EXPECT_EQ((*s->Find("ef.residual"))[3], 0.5f);
    EXPECT_EQ((*s->Find("dgc.momentum"))[2], 7.0f);
    EXPECT_FALSE(s->Find("x").has_value());  // the other job's
  }
  EXPECT_EQ(
      (*target.Acquire("restored", "bias", {5}, 1)->Find("ef.residual"))[4],
      -3.0f);
  EXPECT_EQ(target.resets(), 0u);
  // Exports of equal states are equal bytes.
  EXPECT_EQ(*target.Export("restored"), *blob);
}

TEST(StateStoreTest, ImportRejectsEveryCorruptionWithoutTouchingState) {
  StateStore source;
  Fill(source);
  const Bytes blob = *source.Export("job");
  StateStore target;
  target.Acquire("job", "fc1.weight", {2, 2}, 1)->Buffer("keep", 1)[0] = 4.0f;
  auto untouched = [&] {
    StateStore::Locked s = target.Acquire("job", "fc1.weight", {2, 2}, 1);
    return s->Find("keep").has_value() && !s->Find("ef.residual").has_value();
  };
  for (size_t len = 0; len < blob.size(); ++len) {
    absl::Status s =
        target.Import("job", absl::string_view(blob).substr(0, len));
    ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << len;
    ASSERT_TRUE(untouched()) << len;
  }
  EXPECT_THAT(target.Import("job", blob + "x").message(),
              HasSubstr("expected the end after 2 tensors, got 1 more bytes"));
  Bytes bad = blob;
  bad[0] = 'X';
  EXPECT_THAT(target.Import("job", bad).message(), HasSubstr("magic"));
  bad = blob;
  bad[4] = 3;
  EXPECT_THAT(target.Import("job", bad).message(),
              HasSubstr("expected version 1 or 2, got 3"));
  bad = blob;
  bad[16] = static_cast<char>(0xFF);  // tensor count
  EXPECT_EQ(target.Import("job", bad).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(untouched());
}

TEST(StateStoreTest, RestoreIfResetGivesBackWhatTheResetReplaced) {
  StateStore store;
  const int64_t shape[] = {4, 4};
  const int64_t other[] = {16};
  {
    StateStore::Locked state = store.Acquire("j", "t", shape, 0, "topk");
    state->Buffer("dgc.v", 16)[3] = 2.5f;
  }
  {
    StateStore::Locked state = store.Acquire("j", "t", other, 0, "topk");
    EXPECT_FALSE(state->Find("dgc.v").has_value());
    state->Buffer("dgc.v", 16)[0] = 9.0f;
    state.RestoreIfReset();
    state.RestoreIfReset();  // once only
  }
  EXPECT_EQ(store.resets(), 1u);
  StateStore::Locked state = store.Acquire("j", "t", shape, 0, "topk");
  EXPECT_EQ(store.resets(), 1u);  // the old shape is back: no reset
  ASSERT_TRUE(state->Find("dgc.v").has_value());
  EXPECT_EQ((*state->Find("dgc.v"))[3], 2.5f);
  EXPECT_EQ((*state->Find("dgc.v"))[0], 0.0f);
  state.RestoreIfReset();  // nothing was reset: nothing changes
  EXPECT_EQ((*state->Find("dgc.v"))[3], 2.5f);
}

// What a checkpoint carries besides the buffers (a review helper's
// findings): the owner, so that the next codec resets the state exactly when
// it would have without the restart; the exporting rank, so that another
// rank's blob is refused; and only finite values.
TEST(StateStoreTest,
     ImportKeepsTheOwnerAndRefusesAnotherRanksOrNonFiniteState) {
  const int64_t shape[] = {4};
  StateStore source;
  source.Acquire("job", "w", shape, 0, "efsign")->Buffer("ef.residual", 4)[1] =
      0.5f;
  const Bytes blob = *source.Export("job", {1, 2});

  // The same codec keeps the residual; another one starts afresh, as it
  // would have on the daemon that exported it.
  StateStore same;
  ASSERT_TRUE(same.Import("job", blob, nullptr, {1, 2}).ok());
  EXPECT_EQ(
      (*same.Acquire("job", "w", shape, 0, "efsign")->Find("ef.residual"))[1],
      0.5f);
  StateStore next;
  ASSERT_TRUE(next.Import("job", blob, nullptr, {1, 2}).ok());
  EXPECT_FALSE(next.Acquire("job", "w", shape, 0, "threshold")
                   ->Find("ef.residual")
                   .has_value());

  StateStore other_rank;
  const absl::Status refused = other_rank.Import("job", blob, nullptr, {0, 2});
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(),
              HasSubstr("exported by rank 1 of 2, and this is rank 0"));
  // Another world size: taken (the engine leaves out its sharded slices).
  EXPECT_TRUE(other_rank.Import("job", blob, nullptr, {0, 4}).ok());

  StateStore poisoned;
  poisoned.Acquire("job", "w", shape, 0, "efsign")
      ->Buffer("ef.residual", 4)[2] = std::nanf("");
  const absl::Status nan = StateStore().Import("job", *poisoned.Export("job"));
  EXPECT_EQ(nan.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      nan.message(),
      HasSubstr("tensor 'w': buffer 'ef.residual' holds nan at index 2"));
}

// Blobs of format 1 (no origin, no owner), written before, still import.
TEST(StateStoreTest, AFormatOneBlobStillImports) {
  Bytes v1("GCST", 4);
  const auto u32 = [&](uint32_t v) {
    v1.append(reinterpret_cast<char*>(&v), 4);
  };
  const auto u64 = [&](uint64_t v) {
    v1.append(reinterpret_cast<char*>(&v), 8);
  };
  u32(1);  // version
  u32(1);  // tensors
  u32(1);
  v1 += "w";
  u32(0);  // dtype
  u32(1);  // ndim
  u64(2);
  u32(1);  // buffers
  u32(11);
  v1 += "ef.residual";
  u64(2);
  const float values[2] = {0.25f, -1.0f};
  v1.append(reinterpret_cast<const char*>(values), sizeof(values));
  StateStore store;
  ASSERT_TRUE(store.Import("job", v1, nullptr, {1, 2}).ok());
  const int64_t shape[] = {2};
  EXPECT_EQ(
      (*store.Acquire("job", "w", shape, 0, "efsign")->Find("ef.residual"))[1],
      -1.0f);
}

}  // namespace
}  // namespace gradcomp::codecs
