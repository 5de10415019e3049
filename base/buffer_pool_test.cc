#include "base/buffer_pool.h"

#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace gradcomp {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

TEST(BufferPoolTest, SizeClassesAreEightPerPowerOfTwo) {
  EXPECT_EQ(BufferPool::SizeClass(kMiB), kMiB);
  EXPECT_EQ(BufferPool::SizeClass(kMiB + 1), kMiB + kMiB / 8);
  EXPECT_EQ(BufferPool::SizeClass(kMiB + kMiB / 8), kMiB + kMiB / 8);
  EXPECT_EQ(BufferPool::SizeClass(2 * kMiB - 1), 2 * kMiB);
  EXPECT_EQ(BufferPool::SizeClass(10), 10u);
}

TEST(BufferPoolTest, TakeGivesAnEmptyBufferOfItsClass) {
  BufferPool pool(64 * kMiB);
  const std::string buffer = pool.Take(kMiB + 1);
  EXPECT_TRUE(buffer.empty());
  EXPECT_GE(buffer.capacity(), BufferPool::SizeClass(kMiB + 1));
  EXPECT_EQ(pool.taken(), 1u);
  EXPECT_EQ(pool.reused(), 0u);
}

TEST(BufferPoolTest, AGivenBufferIsReusedByATakeOfItsClass) {
  BufferPool pool(64 * kMiB);
  std::string buffer = pool.Take(3 * kMiB);
  buffer.append(3 * kMiB, 'x');
  const char* memory = buffer.data();
  pool.Give(std::move(buffer));
  EXPECT_EQ(pool.pooled_bytes(), BufferPool::SizeClass(3 * kMiB));

  // Another size of the same class gets the same memory, emptied.
  const std::string again = pool.Take(3 * kMiB - 100);
  EXPECT_EQ(again.data(), memory);
  EXPECT_TRUE(again.empty());
  EXPECT_EQ(pool.reused(), 1u);
  EXPECT_EQ(pool.pooled_bytes(), 0u);
}

TEST(BufferPoolTest, ABufferOfAnotherClassIsNotReused) {
  BufferPool pool(64 * kMiB);
  std::string small = pool.Take(kMiB);
  const char* memory = small.data();
  pool.Give(std::move(small));
  const std::string large = pool.Take(4 * kMiB);
  EXPECT_NE(large.data(), memory);
  EXPECT_GE(large.capacity(), 4 * kMiB);
  EXPECT_EQ(pool.reused(), 0u);
}

TEST(BufferPoolTest, ABufferGrownElsewhereIsFiledUnderAClassItHolds) {
  BufferPool pool(64 * kMiB);
  std::string grown;
  grown.reserve(kMiB + kMiB / 16);  // between two classes
  pool.Give(std::move(grown));
  // Not handed to a Take that needs the class above...
  EXPECT_GE(pool.Take(kMiB + kMiB / 8).capacity(), kMiB + kMiB / 8);
  EXPECT_EQ(pool.reused(), 0u);
  // ...but to one of the class below it.
  EXPECT_GE(pool.Take(kMiB).capacity(), kMiB);
  EXPECT_EQ(pool.reused(), 1u);
}

TEST(BufferPoolTest, ABufferInUseIsNeverHandedOut) {
  BufferPool pool(64 * kMiB);
  std::string first = pool.Take(2 * kMiB);
  pool.Give(pool.Take(2 * kMiB));  // one pooled buffer of the class
  std::string second = pool.Take(2 * kMiB);
  std::string third = pool.Take(2 * kMiB);  // none left: a fresh one
  EXPECT_NE(first.data(), second.data());
  EXPECT_NE(first.data(), third.data());
  EXPECT_NE(second.data(), third.data());
  EXPECT_EQ(pool.reused(), 1u);
}

TEST(BufferPoolTest, TheCapIsRespected) {
  BufferPool pool(5 * kMiB);
  std::vector<std::string> held;
  for (int i = 0; i < 4; ++i) held.push_back(pool.Take(2 * kMiB));
  for (std::string& buffer : held) pool.Give(std::move(buffer));
  EXPECT_EQ(pool.pooled_bytes(), 4 * kMiB);  // the third would exceed 5 MiB
  EXPECT_LE(pool.pooled_bytes(), pool.max_pooled_bytes());
}

TEST(BufferPoolTest, SmallBuffersAreNotPooled) {
  BufferPool pool(64 * kMiB, /*min_buffer_bytes=*/kMiB);
  pool.Give(pool.Take(kMiB / 2));
  EXPECT_EQ(pool.pooled_bytes(), 0u);
}

TEST(BufferPoolTest, ASharedBufferComesBackWhenItsLastOwnerLetsGo) {
  BufferPool pool(64 * kMiB);
  std::string buffer = pool.Take(kMiB);
  buffer.assign(kMiB, 'y');
  const char* memory = buffer.data();
  std::shared_ptr<const std::string> shared = pool.Share(std::move(buffer));
  std::shared_ptr<const std::string> copy = shared;
  EXPECT_EQ((*copy)[kMiB - 1], 'y');
  shared.reset();
  EXPECT_EQ(pool.pooled_bytes(), 0u);  // still owned by `copy`
  copy.reset();
  EXPECT_EQ(pool.pooled_bytes(), kMiB);
  EXPECT_EQ(pool.Take(kMiB).data(), memory);
}

TEST(BufferPoolTest, DrainAndDestructionFreeThePooledBuffers) {
  std::shared_ptr<const std::string> outliving;
  {
    BufferPool pool(64 * kMiB);
    pool.Give(pool.Take(kMiB));
    pool.Give(pool.Take(2 * kMiB));
    EXPECT_EQ(pool.pooled_bytes(), 3 * kMiB);
    pool.Drain();
    EXPECT_EQ(pool.pooled_bytes(), 0u);
    pool.Give(pool.Take(kMiB));
    outliving = pool.Share(pool.Take(kMiB));
  }
  // Given back after the pool is gone: freed, not kept (ASan would report
  // a use after free or a leak).
  outliving.reset();
}

TEST(BufferPoolTest, ConcurrentTakersNeverShareABuffer) {
  BufferPool pool(256 * kMiB);
  constexpr int kThreads = 4;
  constexpr int kRounds = 200;
  std::vector<std::thread> threads;
  std::vector<int> corrupted(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&pool, &corrupted, t] {
      for (int i = 0; i < kRounds; ++i) {
        std::string buffer = pool.Take(kMiB);
        buffer.assign(kMiB, static_cast<char>('a' + t));
        // Another thread writing into the same memory would show here.
        if (buffer.find_first_not_of(static_cast<char>('a' + t)) !=
            std::string::npos) {
          ++corrupted[t];
        }
        pool.Give(std::move(buffer));
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(corrupted[t], 0) << t;
  EXPECT_EQ(pool.taken(), uint64_t{kThreads} * kRounds);
  EXPECT_GT(pool.reused(), 0u);
  EXPECT_LE(pool.pooled_bytes(), uint64_t{kThreads} * kMiB);
}

}  // namespace
}  // namespace gradcomp
