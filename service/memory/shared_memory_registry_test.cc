#include "service/memory/shared_memory_registry.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "client/cpp/shm_region.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/metrics/metrics.h"
#include "service/metrics/metrics_testing.h"

namespace gradcomp::service {
namespace {

using ::gradcomp::client::ShmRegion;
using ::testing::HasSubstr;
using ::testing::Not;

SharedMemoryOptions NoBackgroundReclaim() {
  SharedMemoryOptions options;
  options.reclaim_interval = absl::ZeroDuration();
  return options;
}

// A child process that creates a POSIX shm object of `bytes` bytes, so it
// holds the object's shared lock, and waits to be killed. pid -1 if the fork
// failed; an empty key if the child could not create the object.
struct Holder {
  pid_t pid = -1;
  std::string key;
};

Holder ForkHolder(size_t bytes, const char* tag) {
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) return {};
  const pid_t child = fork();
  if (child < 0) return {};
  if (child == 0) {
    close(pipe_fds[0]);
    auto object = ShmRegion::Create(bytes, tag);
    const std::string key = object.ok() ? (*object)->key() : "";
    if (write(pipe_fds[1], key.data(), key.size()) < 0) _exit(2);
    close(pipe_fds[1]);
    pause();
    _exit(0);
  }
  close(pipe_fds[1]);
  char buffer[256];
  const ssize_t n = read(pipe_fds[0], buffer, sizeof(buffer));
  close(pipe_fds[0]);
  return {child, n > 0 ? std::string(buffer, static_cast<size_t>(n)) : ""};
}

class SharedMemoryRegistryTest : public ::testing::Test {
 protected:
  std::unique_ptr<ShmRegion> NewRegion(uint64_t size) {
    absl::StatusOr<std::unique_ptr<ShmRegion>> region =
        ShmRegion::Create(size, "registry-test");
    EXPECT_TRUE(region.ok()) << region.status();
    return region.ok() ? std::move(*region) : nullptr;
  }

  double Metric(absl::string_view name) {
    return MetricValue(*metrics_.collectable(), name);
  }

  // Kills `child` with SIGKILL and expects the next scan of `registry` to
  // drop and count the region `owner` registered as `name` on its lock,
  // leaving the one 64-byte region each test registers beside it, and to
  // unlink the object the child left behind.
  void KillAndExpectReclaimed(SharedMemoryRegistry& registry,
                              const Holder& child, absl::string_view owner,
                              absl::string_view name) {
    ASSERT_EQ(kill(child.pid, SIGKILL), 0);
    ASSERT_EQ(waitpid(child.pid, nullptr, 0), child.pid);
    EXPECT_EQ(registry.ReclaimAbandoned(), 1);
    EXPECT_EQ(Metric("gradcomp_shm_regions_reclaimed_total"), 1);
    EXPECT_EQ(Metric("gradcomp_shm_regions"), 1);
    EXPECT_EQ(Metric("gradcomp_shm_bytes"), 64);
    EXPECT_EQ(registry.Acquire(owner, name, 0, 1).status().code(),
              absl::StatusCode::kNotFound);
    const int fd = shm_open(child.key.c_str(), O_RDONLY, 0);
    EXPECT_LT(fd, 0) << child.key << " is still in /dev/shm";
    if (fd >= 0) {
      close(fd);
      shm_unlink(child.key.c_str());
    }
  }

  Metrics metrics_{nullptr, "test"};
  SharedMemoryRegistry registry_{NoBackgroundReclaim(), &metrics_};
};

TEST_F(SharedMemoryRegistryTest, RegisterAcquireStatusUnregister) {
  std::unique_ptr<ShmRegion> region = NewRegion(8192);
  ASSERT_NE(region, nullptr);
  ASSERT_TRUE(
      registry_.RegisterSystem("c1", "grads", region->key(), 0, 8192).ok());
  EXPECT_EQ(Metric("gradcomp_shm_regions"), 1);
  EXPECT_EQ(Metric("gradcomp_shm_bytes"), 8192);

  {
    auto slice = registry_.Acquire("c1", "grads", 100, 16);
    ASSERT_TRUE(slice.ok()) << slice.status();
    region->bytes()[100] = 'q';
    EXPECT_EQ(slice->bytes().size(), 16u);
    EXPECT_EQ(slice->bytes()[0], 'q');
    auto status = registry_.Status("c1", "");
    ASSERT_TRUE(status.ok());
    ASSERT_EQ(status->size(), 1u);
    EXPECT_EQ((*status)[0].name, "grads");
    EXPECT_EQ((*status)[0].kind, "system");
    EXPECT_EQ((*status)[0].byte_size, 8192u);
    EXPECT_EQ((*status)[0].key, region->key());
    EXPECT_EQ((*status)[0].in_flight, 1);
    EXPECT_EQ((*status)[0].lock_key, "");
  }
  EXPECT_EQ(registry_.Status("c1", "grads").value()[0].in_flight, 0);
  EXPECT_TRUE(registry_.Status("c2", "").value().empty());
  ASSERT_TRUE(registry_.Unregister("c1", "grads").ok());
  EXPECT_EQ(Metric("gradcomp_shm_regions"), 0);
  EXPECT_EQ(Metric("gradcomp_shm_bytes"), 0);
  EXPECT_EQ(registry_.Acquire("c1", "grads", 0, 1).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(SharedMemoryRegistryTest, SlicesOutOfBoundsOrOverflowingAreRefused) {
  std::unique_ptr<ShmRegion> region = NewRegion(4096);
  ASSERT_NE(region, nullptr);
  // Registered from offset 1024: the region is 2048 bytes long.
  ASSERT_TRUE(
      registry_.RegisterSystem("c", "r", region->key(), 1024, 2048).ok());
  const uint64_t max = std::numeric_limits<uint64_t>::max();
  struct Case {
    uint64_t offset, byte_size;
  };
  for (const Case& c : {Case{0, 2049}, Case{2048, 1}, Case{2049, 0},
                        Case{16, max - 8}, Case{max, 1}, Case{1, max}}) {
    absl::StatusOr<SharedMemorySlice> slice =
        registry_.Acquire("c", "r", c.offset, c.byte_size);
    EXPECT_EQ(slice.status().code(), absl::StatusCode::kInvalidArgument)
        << c.offset << " + " << c.byte_size;
    EXPECT_THAT(slice.status().message(),
                HasSubstr("expected offset + byte_size <= 2048"));
  }
  auto last = registry_.Acquire("c", "r", 2047, 1);
  ASSERT_TRUE(last.ok());
  region->bytes()[1024 + 2047] = 'e';
  EXPECT_EQ(last->bytes()[0], 'e');
  // Nothing failed was left counted as in flight.
  EXPECT_EQ(registry_.Status("c", "r").value()[0].in_flight, 1);
}

TEST_F(SharedMemoryRegistryTest, UnknownRegionsAndBadRegistrations) {
  absl::StatusOr<SharedMemorySlice> slice =
      registry_.Acquire("c", "absent", 0, 4);
  EXPECT_EQ(slice.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(slice.status().message(), HasSubstr("no shared-memory region "
                                                  "'absent' is registered"));
  EXPECT_EQ(registry_.Unregister("c", "absent").code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(registry_.Status("c", "absent").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(
      registry_.RegisterSystem("c", "r", "/gradcomp.absent.0", 0, 8).code(),
      absl::StatusCode::kNotFound);
  std::unique_ptr<ShmRegion> region = NewRegion(64);
  ASSERT_NE(region, nullptr);
  EXPECT_EQ(registry_.RegisterSystem("c", "", region->key(), 0, 8).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry_.RegisterSystem("c", "r", region->key(), 8, 64).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Metric("gradcomp_shm_regions"), 0);
}

// With open files to spare (containers often allow 2^20), the mappings
// bound the regions: past vm.max_map_count (65530 by default) every mmap of
// the daemon would fail, its heap's included.
TEST(MaxShmRegionsTest, TheSmallerOfHalfTheFilesAndAQuarterOfTheMappings) {
  EXPECT_EQ(MaxShmRegionsFor(uint64_t{1} << 20, 65530), 16382u);
  EXPECT_EQ(MaxShmRegionsFor(20000, 65530), 10000u);
  EXPECT_EQ(MaxShmRegionsFor(std::nullopt, 65530), 16382u);
  EXPECT_EQ(MaxShmRegionsFor(uint64_t{1} << 20, std::nullopt),
            uint64_t{1} << 19);
  EXPECT_EQ(MaxShmRegionsFor(std::nullopt, std::nullopt), 65536u);
  EXPECT_EQ(MaxShmRegionsFor(100, 65530), 64u);
  EXPECT_EQ(MaxShmRegionsFor(20000, 100), 64u);
}

// Each region holds a file descriptor: past the bound a registration is
// refused (and counted) before its object is opened; an unregistered
// region makes room again.
TEST_F(SharedMemoryRegistryTest, RegistrationsPastTheBoundAreRefused) {
  SharedMemoryOptions options = NoBackgroundReclaim();
  options.max_regions = 2;
  SharedMemoryRegistry registry(options, &metrics_);
  std::vector<std::unique_ptr<ShmRegion>> regions;
  for (int i = 0; i < 3; ++i) {
    regions.push_back(NewRegion(64));
    ASSERT_NE(regions.back(), nullptr);
  }
  ASSERT_TRUE(registry.RegisterSystem("c", "a", regions[0]->key(), 0, 64).ok());
  ASSERT_TRUE(registry.RegisterSystem("c", "b", regions[1]->key(), 0, 64).ok());
  const absl::Status full =
      registry.RegisterSystem("c", "c", regions[2]->key(), 0, 64);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(full.message(),
              HasSubstr("shared-memory region 'c': 2 regions are registered "
                        "on this daemon, its bound"));
  EXPECT_EQ(
      MetricValue(*metrics_.collectable(), "gradcomp_resource_exhausted_total",
                  {{"resource", "shm_regions"}}),
      1);
  ASSERT_TRUE(registry.Unregister("c", "a").ok());
  EXPECT_TRUE(registry.RegisterSystem("c", "c", regions[2]->key(), 0, 64).ok());
}

TEST_F(SharedMemoryRegistryTest, AnObjectWithoutItsCreatorsLockIsRefused) {
  std::unique_ptr<ShmRegion> region = NewRegion(64);
  ASSERT_NE(region, nullptr);
  // A second, unlocked object of the same size stands for a client that
  // does not hold the lock.
  const std::string key = region->key() + "-unlocked";
  const int fd = shm_open(key.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 64), 0);
  absl::Status status = registry_.RegisterSystem("c", "r", key, 0, 64);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("not locked by its creator"));
  close(fd);
  shm_unlink(key.c_str());
}

TEST_F(SharedMemoryRegistryTest, AnObjectOutsideThePrefixIsRefused) {
  // A real, locked object under another name: the name alone refuses it,
  // before the daemon maps anything.
  const std::string key = "/gradcomp-outside-" + std::to_string(getpid());
  const int fd = shm_open(key.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 64), 0);
  ASSERT_EQ(flock(fd, LOCK_SH), 0);
  for (const std::string& outside :
       {key, std::string("/sem.x"), std::string("/gradcomp"), std::string()}) {
    const absl::Status status =
        registry_.RegisterSystem("c", "r", outside, 0, 64);
    EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied) << outside;
    EXPECT_THAT(status.message(), HasSubstr("prefix '/gradcomp.'"));
  }
  // A daemon configured with that prefix takes it.
  SharedMemoryOptions options = NoBackgroundReclaim();
  options.key_prefix = "/gradcomp-outside-";
  SharedMemoryRegistry other(options, &metrics_);
  EXPECT_TRUE(other.RegisterSystem("c", "r", key, 0, 64).ok());
  std::unique_ptr<ShmRegion> ours = NewRegion(64);
  ASSERT_NE(ours, nullptr);
  EXPECT_EQ(other.RegisterSystem("c", "ours", ours->key(), 0, 64).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(other.Unregister("c", "r").ok());
  close(fd);
  shm_unlink(key.c_str());
}

TEST_F(SharedMemoryRegistryTest, AnObjectOfAnotherUidIsRefusedNamingBoth) {
  // A real, locked object under the prefix whose owner is `nobody`: only
  // root can give an object away (fchown), so the case needs root.
  if (geteuid() != 0) GTEST_SKIP() << "needs root to chown an object";
  constexpr uid_t kNobody = 65534;
  const std::string key = "/gradcomp.other-uid." + std::to_string(getpid());
  shm_unlink(key.c_str());  // left by an earlier run (the sandbox reuses pids)
  const int fd = shm_open(key.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 64), 0);
  ASSERT_EQ(flock(fd, LOCK_SH), 0);
  if (fchown(fd, kNobody, kNobody) != 0) {
    const int error = errno;
    close(fd);
    shm_unlink(key.c_str());
    // Bazel's sandbox is a user namespace that maps uid 0 only;
    // client/python/tests/test_client_access.py runs the case outside it.
    if (error == EINVAL) GTEST_SKIP() << "uid 65534 is not mapped here";
    FAIL() << "fchown: " << std::strerror(error);
  }
  const absl::Status status = registry_.RegisterSystem("c", "r", key, 0, 64);
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(status.message(),
              HasSubstr("is owned by uid 65534, not by this daemon's uid 0"));
  EXPECT_THAT(status.message(), HasSubstr("--shm_owner_uids (none)"));
  // The daemon's own objects are taken, as every other test here shows;
  // a daemon told to accept that uid takes this one too.
  SharedMemoryOptions options = NoBackgroundReclaim();
  options.owner_uids = {kNobody};
  SharedMemoryRegistry other(options, &metrics_);
  EXPECT_TRUE(other.RegisterSystem("c", "r", key, 0, 64).ok());
  std::unique_ptr<ShmRegion> ours = NewRegion(64);
  ASSERT_NE(ours, nullptr);
  EXPECT_TRUE(other.RegisterSystem("c", "ours", ours->key(), 0, 64).ok());
  EXPECT_TRUE(other.Unregister("c", "").ok());
  close(fd);
  shm_unlink(key.c_str());
}

TEST_F(SharedMemoryRegistryTest, TwoClientsWithTheSameNameGetAClearError) {
  std::unique_ptr<ShmRegion> a = NewRegion(64);
  std::unique_ptr<ShmRegion> b = NewRegion(64);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(
      registry_.RegisterSystem("job1-rank0", "grads", a->key(), 0, 64).ok());
  absl::Status status =
      registry_.RegisterSystem("job2-rank0", "grads", b->key(), 0, 64);
  EXPECT_EQ(status.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(status.message(),
              HasSubstr("already registered by another client;"));
  // The owner's id is not told: ids are chosen by clients.
  EXPECT_THAT(status.message(), Not(HasSubstr("job1-rank0")));
  // The same client twice is refused as well, naming itself.
  EXPECT_THAT(registry_.RegisterSystem("job1-rank0", "grads", b->key(), 0, 64)
                  .message(),
              HasSubstr("already registered by this client"));
  // The second client can neither use nor unregister the first's region.
  EXPECT_EQ(registry_.Acquire("job2-rank0", "grads", 0, 8).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(registry_.Unregister("job2-rank0", "grads").code(),
            absl::StatusCode::kPermissionDenied);
  // Unregistering all of its (zero) regions leaves the first's alone.
  EXPECT_TRUE(registry_.Unregister("job2-rank0", "").ok());
  EXPECT_TRUE(registry_.Acquire("job1-rank0", "grads", 0, 8).ok());
}

TEST_F(SharedMemoryRegistryTest, UnregisterRefusesWhileASliceIsInFlight) {
  std::unique_ptr<ShmRegion> a = NewRegion(64);
  std::unique_ptr<ShmRegion> b = NewRegion(64);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(registry_.RegisterSystem("c", "a", a->key(), 0, 64).ok());
  ASSERT_TRUE(registry_.RegisterSystem("c", "b", b->key(), 0, 64).ok());
  {
    auto in = registry_.Acquire("c", "a", 0, 32);
    auto out = registry_.Acquire("c", "a", 32, 32);
    ASSERT_TRUE(in.ok());
    ASSERT_TRUE(out.ok());
    absl::Status status = registry_.Unregister("c", "a");
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(status.message(), HasSubstr("'a' (2 in flight)"));
    // All or nothing: "b" stays registered too.
    EXPECT_EQ(registry_.Unregister("c", "").code(),
              absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(registry_.Status("c", "").value().size(), 2u);
    // Still mapped and usable while refused.
    a->bytes()[40] = 'k';
    EXPECT_EQ(out->bytes()[8], 'k');
  }
  EXPECT_TRUE(registry_.Unregister("c", "").ok());
  EXPECT_TRUE(registry_.Status("c", "").value().empty());
}

// One object's bytes reach one region: a second name for them would let a
// request's input and output overlap while their region names differ.
TEST_F(SharedMemoryRegistryTest, BytesAlreadyRegisteredAreRefused) {
  std::unique_ptr<ShmRegion> region = NewRegion(8192);
  ASSERT_NE(region, nullptr);
  ASSERT_TRUE(
      registry_.RegisterSystem("c1", "low", region->key(), 0, 4096).ok());
  const absl::Status alias =
      registry_.RegisterSystem("c1", "alias", region->key(), 4000, 200);
  EXPECT_EQ(alias.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(alias.message(), HasSubstr("already registered as region 'low'"));
  const absl::Status theirs =
      registry_.RegisterSystem("c2", "alias", region->key(), 0, 8192);
  EXPECT_EQ(theirs.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(theirs.message(), HasSubstr("registered by another client;"));
  EXPECT_THAT(theirs.message(), Not(HasSubstr("low")));
  // The bytes after it are free, and so are its own once unregistered.
  EXPECT_TRUE(
      registry_.RegisterSystem("c1", "high", region->key(), 4096, 4096).ok());
  ASSERT_TRUE(registry_.Unregister("c1", "low").ok());
  EXPECT_TRUE(
      registry_.RegisterSystem("c1", "alias", region->key(), 4000, 96).ok());
  EXPECT_EQ(Metric("gradcomp_shm_regions"), 2);
}

// A real client process holds a region and is killed with SIGKILL: the
// kernel drops its lock, and the registry reclaims the region and counts it.
TEST_F(SharedMemoryRegistryTest, AKilledClientsRegionsAreReclaimed) {
  const Holder child = ForkHolder(4096, "registry-test-child");
  ASSERT_GT(child.pid, 0);
  ASSERT_FALSE(child.key.empty()) << "the child could not create its region";
  const std::string& key = child.key;

  std::unique_ptr<ShmRegion> survivor = NewRegion(64);
  ASSERT_NE(survivor, nullptr);
  ASSERT_TRUE(registry_.RegisterSystem("child", "c", key, 0, 4096).ok());
  ASSERT_TRUE(
      registry_.RegisterSystem("parent", "p", survivor->key(), 0, 64).ok());
  EXPECT_EQ(registry_.ReclaimAbandoned(), 0);
  absl::StatusOr<SharedMemorySlice> in_flight =
      registry_.Acquire("child", "c", 0, 4096);
  ASSERT_TRUE(in_flight.ok());

  ASSERT_NO_FATAL_FAILURE(
      KillAndExpectReclaimed(registry_, child, "child", "c"));
  // The slice taken before the kill still reads and writes its mapping.
  in_flight->bytes()[4095] = 'w';
  EXPECT_EQ(in_flight->bytes()[4095], 'w');
  EXPECT_TRUE(registry_.Acquire("parent", "p", 0, 64).ok());
}

// Device memory without a GPU: counts its opens and closes, so the tests
// see when the registry would have closed a CUDA IPC handle.
class FakeDeviceRegion : public DeviceRegion {
 public:
  FakeDeviceRegion(uint64_t byte_size, int* closed)
      : byte_size_(byte_size), closed_(closed) {}
  ~FakeDeviceRegion() override { ++*closed_; }
  uint64_t byte_size() const override { return byte_size_; }
  int device_id() const override { return 0; }
  void* device_address(uint64_t) const override { return nullptr; }
  absl::Status CopyToHost(uint64_t, absl::Span<char>) const override {
    return absl::OkStatus();
  }
  absl::Status CopyFromHost(uint64_t, absl::Span<const char>) const override {
    return absl::OkStatus();
  }

 private:
  const uint64_t byte_size_;
  int* const closed_;
};

const std::string kHandle(kCudaIpcHandleBytes, '\0');

class CudaRegionLockTest : public SharedMemoryRegistryTest {
 protected:
  static SharedMemoryOptions FakeDevice(int* opened, int* closed) {
    SharedMemoryOptions options = NoBackgroundReclaim();
    options.device_region_opener = [opened, closed](absl::string_view, int,
                                                    uint64_t byte_size)
        -> absl::StatusOr<std::unique_ptr<DeviceRegion>> {
      ++*opened;
      return std::make_unique<FakeDeviceRegion>(byte_size, closed);
    };
    return options;
  }

  int opened_ = 0;
  int closed_ = 0;
  SharedMemoryRegistry cuda_{FakeDevice(&opened_, &closed_), &metrics_};
};

TEST_F(CudaRegionLockTest, AHeldLockKeepsTheRegion) {
  std::unique_ptr<ShmRegion> lock = NewRegion(1);
  ASSERT_NE(lock, nullptr);
  ASSERT_TRUE(
      cuda_.RegisterCuda("c", "dev", kHandle, 0, 4096, lock->key()).ok());
  EXPECT_EQ(cuda_.ReclaimAbandoned(), 0);
  EXPECT_EQ(cuda_.ReclaimAbandoned(), 0);
  EXPECT_TRUE(cuda_.Acquire("c", "dev", 0, 4096).ok());
  const SharedMemoryRegionInfo info = cuda_.Status("c", "dev").value()[0];
  EXPECT_EQ(info.kind, "cuda");
  EXPECT_EQ(info.lock_key, lock->key());
  EXPECT_EQ(closed_, 0);
  // Released by the client: the next scan drops it and closes the handle.
  lock.reset();
  EXPECT_EQ(cuda_.ReclaimAbandoned(), 1);
  EXPECT_EQ(closed_, 1);
}

// A real client process holds the lock and is killed with SIGKILL: the next
// scan drops its CUDA region and counts it, but the handle stays open until
// the request in flight lets go. A CUDA region registered without a lock is
// left alone, as before.
TEST_F(CudaRegionLockTest, AKilledHoldersRegionIsReclaimedAfterItsLastSlice) {
  const Holder child = ForkHolder(1, "registry-test-cuda-lock");
  ASSERT_GT(child.pid, 0);
  ASSERT_FALSE(child.key.empty())
      << "the child could not create its lock object";
  const std::string& key = child.key;

  ASSERT_TRUE(cuda_.RegisterCuda("child", "dev", kHandle, 0, 4096, key).ok());
  ASSERT_TRUE(cuda_.RegisterCuda("other", "unlocked", kHandle, 0, 64, "").ok());
  EXPECT_EQ(cuda_.ReclaimAbandoned(), 0);
  std::optional<SharedMemorySlice> in_flight;
  {
    absl::StatusOr<SharedMemorySlice> slice =
        cuda_.Acquire("child", "dev", 0, 4096);
    ASSERT_TRUE(slice.ok()) << slice.status();
    in_flight.emplace(std::move(*slice));
  }

  ASSERT_NO_FATAL_FAILURE(KillAndExpectReclaimed(cuda_, child, "child", "dev"));
  EXPECT_EQ(closed_, 0) << "closed under a request in flight";
  EXPECT_NE(in_flight->device_id(), -1);
  in_flight.reset();  // the request returns
  EXPECT_EQ(closed_, 1);
  EXPECT_EQ(cuda_.ReclaimAbandoned(), 0);
  EXPECT_TRUE(cuda_.Acquire("other", "unlocked", 0, 64).ok());
}

TEST_F(CudaRegionLockTest, BadLocksAreRefusedAndNothingIsOpened) {
  std::unique_ptr<ShmRegion> held = NewRegion(1);
  ASSERT_NE(held, nullptr);
  // Absent, outside the prefix, not locked by anyone, and empty (a lock
  // must hold at least one byte).
  const std::string absent = held->key() + "-absent";
  const std::string outside = "/gradcomp-lock-" + std::to_string(getpid());
  const std::string unlocked = held->key() + "-unlocked";
  const std::string empty = held->key() + "-empty";
  std::vector<int> fds;
  for (const std::string& key : {outside, unlocked, empty}) {
    const int fd = shm_open(key.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    ASSERT_GE(fd, 0) << key;
    ASSERT_EQ(ftruncate(fd, key == empty ? 0 : 1), 0);
    if (key != unlocked) {
      ASSERT_EQ(flock(fd, LOCK_SH), 0);
    }
    fds.push_back(fd);
  }
  struct Case {
    std::string key;
    absl::StatusCode code;
    std::string says;
  };
  for (const Case& c :
       {Case{absent, absl::StatusCode::kNotFound, "lock_key: cannot open"},
        Case{outside, absl::StatusCode::kPermissionDenied,
             "lock_key '" + outside + "' is outside the allowed prefix"},
        Case{unlocked, absl::StatusCode::kFailedPrecondition,
             "not locked by its creator"},
        Case{empty, absl::StatusCode::kInvalidArgument, "holds 0 bytes"},
        Case{"gradcomp.no-slash", absl::StatusCode::kPermissionDenied,
             "outside the allowed prefix"}}) {
    const absl::Status status =
        cuda_.RegisterCuda("c", "dev", kHandle, 0, 4096, c.key);
    EXPECT_EQ(status.code(), c.code) << c.key << ": " << status;
    EXPECT_THAT(status.message(), HasSubstr(c.says)) << c.key;
  }
  EXPECT_EQ(opened_, 0);
  EXPECT_TRUE(cuda_.Status("c", "").value().empty());
  for (const int fd : fds) close(fd);
  for (const std::string& key : {outside, unlocked, empty}) {
    shm_unlink(key.c_str());
  }
}

TEST(SharedMemoryRegistryBackgroundTest, TheReclaimerRunsOnItsOwn) {
  Metrics metrics(nullptr, "test");
  SharedMemoryOptions options;
  options.reclaim_interval = absl::Milliseconds(5);
  SharedMemoryRegistry registry(options, &metrics);
  auto region = ShmRegion::Create(64, "registry-test");
  ASSERT_TRUE(region.ok());
  ASSERT_TRUE(registry.RegisterSystem("c", "r", (*region)->key(), 0, 64).ok());
  region->reset();
  // Waits for the outcome, not for a time: the loop ends as soon as the
  // background thread has reclaimed the region.
  while (MetricValue(*metrics.collectable(),
                     "gradcomp_shm_regions_reclaimed_total") < 1) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_TRUE(registry.Status("c", "").value().empty());
}

}  // namespace
}  // namespace gradcomp::service
