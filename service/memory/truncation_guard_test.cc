#include "service/memory/truncation_guard.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gradcomp::service {
namespace {

using ::testing::HasSubstr;

const size_t kPage = static_cast<size_t>(sysconf(_SC_PAGESIZE));

// A shared mapping of a three-page memory file full of 0x5a; its file can
// be truncated under it like a client's shm object.
class SharedFile {
 public:
  SharedFile() {
    fd_ = memfd_create("truncation-guard-test", MFD_CLOEXEC);
    EXPECT_GE(fd_, 0);
    EXPECT_EQ(ftruncate(fd_, 3 * kPage), 0);
    void* base =
        mmap(nullptr, 3 * kPage, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    EXPECT_NE(base, MAP_FAILED);
    bytes_ = static_cast<volatile char*>(base);
    std::memset(base, 0x5a, 3 * kPage);
  }
  ~SharedFile() {
    munmap(const_cast<char*>(bytes_), 3 * kPage);
    close(fd_);
  }
  void TruncateTo(size_t size) { ASSERT_EQ(ftruncate(fd_, size), 0); }
  volatile char* bytes() { return bytes_; }

 private:
  int fd_ = -1;
  volatile char* bytes_ = nullptr;
};

TEST(TruncationGuardTest, PastTheNewEndReadsZerosAndFaultIsReported) {
  SharedFile file;
  auto guard =
      TruncationGuard::Guard(const_cast<char*>(file.bytes()), 3 * kPage);
  ASSERT_TRUE(guard.ok()) << guard.status();
  EXPECT_FALSE((*guard)->faulted());
  file.TruncateTo(kPage);
  EXPECT_EQ(file.bytes()[0], 0x5a);  // still backed: not a fault
  EXPECT_FALSE((*guard)->faulted());

  EXPECT_EQ(file.bytes()[kPage + 7], 0);
  EXPECT_TRUE((*guard)->faulted());
  file.bytes()[2 * kPage] = 1;  // lands in the zero page, no second fault
  EXPECT_EQ(file.bytes()[2 * kPage], 1);
  EXPECT_EQ(file.bytes()[kPage - 1], 0x5a);  // before the fault: untouched
}

// With one mapping guarded, reads past the end of another, truncated one;
// exits 0 only if that fault was taken for the guarded mapping's.
void FaultOutsideTheGuard() {
  SharedFile guarded;
  auto guard =
      TruncationGuard::Guard(const_cast<char*>(guarded.bytes()), 3 * kPage);
  SharedFile unguarded;
  unguarded.TruncateTo(0);
  (void)unguarded.bytes()[kPage];
  _exit(0);
}

TEST(TruncationGuardTest, AFaultOutsideEveryGuardStillEndsTheProcess) {
  EXPECT_EXIT(FaultOutsideTheGuard(), ::testing::KilledBySignal(SIGBUS), "");
}

// A handler that was there first (a sanitizer's, libFuzzer's) still gets
// the faults outside every guard.
TEST(TruncationGuardTest, AFaultOutsideEveryGuardGoesToTheHandlerBefore) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // a process without ours
  EXPECT_EXIT(
      {
        struct sigaction first;
        std::memset(&first, 0, sizeof(first));
        first.sa_sigaction = +[](int, siginfo_t*, void*) { _exit(7); };
        first.sa_flags = SA_SIGINFO;
        sigemptyset(&first.sa_mask);
        sigaction(SIGBUS, &first, nullptr);
        FaultOutsideTheGuard();
      },
      ::testing::ExitedWithCode(7), "");
}

TEST(TruncationGuardTest, AGuardGivenBackNoLongerCatches) {
  EXPECT_EXIT(
      {
        SharedFile file;
        {
          auto guard = TruncationGuard::Guard(const_cast<char*>(file.bytes()),
                                              3 * kPage);
        }
        file.TruncateTo(0);
        (void)file.bytes()[0];
        _exit(0);
      },
      ::testing::KilledBySignal(SIGBUS), "");
}

TEST(TruncationGuardTest, TheTableIsBoundedAndItsSlotsAreReused) {
  static char range[64];
  std::vector<std::unique_ptr<TruncationGuard>> guards;
  for (int i = 0; i < TruncationGuard::kCapacity; ++i) {
    auto guard = TruncationGuard::Guard(range, sizeof(range));
    ASSERT_TRUE(guard.ok()) << i << ": " << guard.status();
    guards.push_back(*std::move(guard));
  }
  auto refused = TruncationGuard::Guard(range, sizeof(range));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("65536 shared-memory mappings are in use"));
  guards[123].reset();
  EXPECT_TRUE(TruncationGuard::Guard(range, sizeof(range)).ok());
}

}  // namespace
}  // namespace gradcomp::service
