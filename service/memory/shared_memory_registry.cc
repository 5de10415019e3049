#include "service/memory/shared_memory_registry.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/algorithm/container.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace gradcomp::service {

SharedMemorySlice::SharedMemorySlice(std::shared_ptr<SharedMemoryRegion> region,
                                     absl::Span<char> bytes, uint64_t offset)
    : region_(std::move(region)), bytes_(bytes), offset_(offset) {
  region_->in_flight.fetch_add(1);
}

SharedMemorySlice::SharedMemorySlice(SharedMemorySlice&& other) noexcept
    : region_(std::move(other.region_)),
      bytes_(other.bytes_),
      offset_(other.offset_) {}

absl::Status SharedMemorySlice::CheckStillBacked() const {
  if (on_device()) return absl::OkStatus();
  return region_->mapping->CheckStillBacked();
}

absl::Status SharedMemorySlice::CopyToHost(absl::Span<char> out) const {
  if (!on_device() || out.size() != bytes_.size()) {
    return absl::InternalError(absl::StrCat(
        "CopyToHost of shared-memory region '", region_->name,
        "': expected a CUDA region and ", bytes_.size(), " bytes, got ",
        on_device() ? "a CUDA" : "a system", " region and ", out.size()));
  }
  return region_->cuda->CopyToHost(offset_, out);
}

absl::Status SharedMemorySlice::CopyFromHost(absl::Span<const char> in) const {
  if (!on_device() || in.size() != bytes_.size()) {
    return absl::InternalError(absl::StrCat(
        "CopyFromHost of shared-memory region '", region_->name,
        "': expected a CUDA region and ", bytes_.size(), " bytes, got ",
        on_device() ? "a CUDA" : "a system", " region and ", in.size()));
  }
  return region_->cuda->CopyFromHost(offset_, in);
}

SharedMemorySlice::~SharedMemorySlice() {
  if (region_ != nullptr) region_->in_flight.fetch_sub(1);
}

size_t MaxShmRegionsFor(std::optional<uint64_t> open_files,
                        std::optional<uint64_t> max_map_count) {
  size_t bound = size_t{1} << 16;
  if (open_files.has_value()) bound = static_cast<size_t>(*open_files / 2);
  // Past vm.max_map_count every mmap of the process fails: the heap's,
  // thread stacks', the SIGBUS guard's. A quarter leaves the rest of them.
  if (max_map_count.has_value()) {
    bound = std::min(bound, static_cast<size_t>(*max_map_count / 4));
  }
  return std::max<size_t>(64, bound);
}

size_t DefaultMaxShmRegions() {
  std::optional<uint64_t> open_files;
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 &&
      limit.rlim_cur != RLIM_INFINITY) {
    open_files = limit.rlim_cur;
  }
  std::optional<uint64_t> max_map_count;
  if (std::FILE* f = std::fopen("/proc/sys/vm/max_map_count", "r")) {
    unsigned long long maps = 0;
    if (std::fscanf(f, "%llu", &maps) == 1) max_map_count = maps;
    std::fclose(f);
  }
  return MaxShmRegionsFor(open_files, max_map_count);
}

SharedMemoryRegistry::SharedMemoryRegistry(const SharedMemoryOptions& options,
                                           Metrics* metrics)
    : metrics_(metrics),
      key_prefix_(options.key_prefix),
      owner_uids_(options.owner_uids),
      device_region_opener_(options.device_region_opener),
      max_regions_(options.max_regions != 0 ? options.max_regions
                                            : DefaultMaxShmRegions()) {
  if (options.reclaim_interval > absl::ZeroDuration()) {
    reclaimer_ = std::thread(
        [this, interval = options.reclaim_interval] { ReclaimLoop(interval); });
  }
}

SharedMemoryRegistry::~SharedMemoryRegistry() {
  stop_.Notify();
  if (reclaimer_.joinable()) reclaimer_.join();
}

void SharedMemoryRegistry::ReclaimLoop(absl::Duration interval) {
  while (!stop_.WaitForNotificationWithTimeout(interval)) ReclaimAbandoned();
}

absl::Status SharedMemoryRegistry::FullError(absl::string_view name) const {
  if (metrics_ != nullptr) metrics_->CountResourceExhausted("shm_regions");
  return absl::ResourceExhaustedError(absl::StrCat(
      "shared-memory region '", name, "': ", max_regions_,
      " regions are registered on this daemon, its bound (half its "
      "open-file limit or a quarter of vm.max_map_count, the smaller); "
      "expected regions reused, or unregistered once no longer used"));
}

absl::Status SharedMemoryRegistry::CheckNewName(absl::string_view client,
                                                absl::string_view name) const {
  if (name.empty()) {
    return absl::InvalidArgumentError(
        "shared-memory region name is empty, expected a name unique on this "
        "daemon (e.g. '<job>.rank<r>.grads')");
  }
  // Checked before mapping too, so a name clash says so rather than
  // whatever is wrong with the second client's object.
  absl::ReaderMutexLock lock(&mu_);
  if (auto it = regions_.find(name); it != regions_.end()) {
    return absl::AlreadyExistsError(absl::StrCat(
        "shared-memory region '", name, "' is already registered by ",
        // Never the other client's id: ids are chosen by clients, and
        // one read here could be sent to use the region.
        it->second->owner == client ? "this client" : "another client",
        "; region names are unique per daemon: unregister it first or "
        "choose another name (prefix it with your job and rank)"));
  }
  // Checked again when the region is inserted; here, before its object is
  // opened.
  if (regions_.size() >= max_regions_) return FullError(name);
  return absl::OkStatus();
}

absl::Status SharedMemoryRegistry::Insert(
    std::shared_ptr<SharedMemoryRegion> region) {
  absl::MutexLock lock(&mu_);
  if (regions_.size() >= max_regions_) return FullError(region->name);
  if (region->mapping != nullptr) {
    // Two names for the same bytes would defeat every check that tells
    // slices apart by region name (an input and an output that overlap).
    for (const auto& [name, other] : regions_) {
      if (other->mapping == nullptr ||
          !other->mapping->Overlaps(*region->mapping)) {
        continue;
      }
      return absl::AlreadyExistsError(absl::StrCat(
          "shm_key '", region->mapping->key(), "' offset ",
          region->mapping->offset(), " + byte_size ",
          region->mapping->bytes().size(), ": these bytes are already ",
          other->owner == region->owner
              ? absl::StrCat("registered as region '", name, "'")
              : "registered by another client",
          "; register each byte of an object once (one region per buffer, "
          "or unregister the other first)"));
    }
  }
  auto [it, inserted] = regions_.try_emplace(region->name, region);
  if (!inserted) {
    return absl::AlreadyExistsError(absl::StrCat(
        "shared-memory region '", region->name,
        "' was registered by another request meanwhile; region names are "
        "unique per daemon"));
  }
  PublishLocked();
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<MappedRegion>>
SharedMemoryRegistry::MapHeldObject(absl::string_view field,
                                    const std::string& key, uint64_t offset,
                                    uint64_t byte_size,
                                    absl::string_view held_for) const {
  if (!absl::StartsWith(key, key_prefix_)) {
    return absl::PermissionDeniedError(absl::StrCat(
        field, " '", key, "' is outside the allowed prefix '", key_prefix_,
        "': this daemon maps only shared-memory objects named '", key_prefix_,
        "...' (gradcompd --shm_prefix; give gradcomp's shm helpers the same "
        "prefix: ShmRegion::Create's prefix, Python's "
        "Client(shm_prefix=...))"));
  }
  absl::StatusOr<std::unique_ptr<MappedRegion>> mapping =
      MappedRegion::Map(key, offset, byte_size);
  if (!mapping.ok()) {
    return absl::Status(mapping.status().code(),
                        absl::StrCat(field, ": ", mapping.status().message()));
  }
  absl::StatusOr<uid_t> owner = (*mapping)->OwnerUid();
  if (!owner.ok()) return owner.status();
  const uid_t self = geteuid();
  if (*owner != self && !absl::c_linear_search(owner_uids_, *owner)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "shared memory '", key, "' is owned by uid ", *owner,
        ", not by this daemon's uid ", self,
        ": gradcompd cannot tell which uid calls it, so it maps only objects "
        "of its own uid or of --shm_owner_uids (",
        owner_uids_.empty() ? "none" : absl::StrJoin(owner_uids_, ","),
        "); create the object as uid ", self, " or add ", *owner,
        " to --shm_owner_uids"));
  }
  absl::StatusOr<bool> alive = (*mapping)->CreatorAlive();
  if (!alive.ok()) return alive.status();
  if (!*alive) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shared memory '", key,
        "' is not locked by its creator: hold flock(fd, LOCK_SH) on it for "
        "as long as ",
        held_for,
        " (gradcomp's clients do), so that gradcompd can reclaim it when "
        "your process exits"));
  }
  return mapping;
}

absl::Status SharedMemoryRegistry::RegisterSystem(absl::string_view client,
                                                  absl::string_view name,
                                                  const std::string& key,
                                                  uint64_t offset,
                                                  uint64_t byte_size) {
  if (absl::Status fresh = CheckNewName(client, name); !fresh.ok()) {
    return fresh;
  }
  absl::StatusOr<std::unique_ptr<MappedRegion>> mapping =
      MapHeldObject("shm_key", key, offset, byte_size, "it is registered");
  if (!mapping.ok()) return mapping.status();
  auto region = std::make_shared<SharedMemoryRegion>();
  region->name = std::string(name);
  region->owner = std::string(client);
  region->mapping = std::move(*mapping);
  return Insert(std::move(region));
}

absl::Status SharedMemoryRegistry::RegisterCuda(absl::string_view client,
                                                absl::string_view name,
                                                absl::string_view raw_handle,
                                                int device_id,
                                                uint64_t byte_size,
                                                const std::string& lock_key) {
  if (absl::Status fresh = CheckNewName(client, name); !fresh.ok()) {
    return fresh;
  }
  if (absl::Status valid =
          ValidateCudaIpcRequest(raw_handle, device_id, byte_size);
      !valid.ok()) {
    return valid;
  }
  // The lock is checked before the handle is opened: a bad lock opens
  // nothing on the device.
  std::unique_ptr<MappedRegion> lock;
  if (!lock_key.empty()) {
    absl::StatusOr<std::unique_ptr<MappedRegion>> held = MapHeldObject(
        "lock_key", lock_key, 0, 1, "the CUDA region should stay registered");
    if (!held.ok()) return held.status();
    lock = std::move(*held);
  }
  absl::StatusOr<std::unique_ptr<DeviceRegion>> cuda =
      device_region_opener_(raw_handle, device_id, byte_size);
  if (absl::IsFailedPrecondition(cuda.status())) {
    absl::call_once(gpu_unavailable_once_, [&] {
      std::fprintf(stderr,
                   "gradcompd: %s; CUDA shared memory is refused, tensors "
                   "run on CPU\n",
                   std::string(cuda.status().message()).c_str());
      metrics_->CountGpuUnavailable();
    });
  }
  if (!cuda.ok()) return cuda.status();
  auto region = std::make_shared<SharedMemoryRegion>();
  region->name = std::string(name);
  region->owner = std::string(client);
  region->cuda = std::move(*cuda);
  region->lock = std::move(lock);
  return Insert(std::move(region));
}

absl::StatusOr<std::shared_ptr<SharedMemoryRegion>>
SharedMemoryRegistry::FindLocked(absl::string_view client,
                                 absl::string_view name) const {
  auto it = regions_.find(name);
  if (it == regions_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no shared-memory region '", name,
                     "' is registered; expected a name given to "
                     "Register{System,Cuda}SharedMemory by this client"));
  }
  if (it->second->owner != client) {
    return absl::PermissionDeniedError(absl::StrCat(
        "shared-memory region '", name,
        "' belongs to another client; a client uses only the regions it "
        "registered"));
  }
  return it->second;
}

absl::Status SharedMemoryRegistry::Unregister(absl::string_view client,
                                              absl::string_view name) {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> names;
  if (name.empty()) {
    for (const auto& [region_name, region] : regions_) {
      if (region->owner == client) names.push_back(region_name);
    }
  } else {
    absl::StatusOr<std::shared_ptr<SharedMemoryRegion>> region =
        FindLocked(client, name);
    if (!region.ok()) return region.status();
    names.push_back(std::string(name));
  }
  // Slices are taken under mu_, so a count of zero seen here stays zero
  // until the region leaves the map.
  std::vector<std::string> busy;
  for (const std::string& n : names) {
    const int in_flight = regions_.at(n)->in_flight.load();
    if (in_flight > 0) {
      busy.push_back(absl::StrCat("'", n, "' (", in_flight, " in flight)"));
    }
  }
  if (!busy.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shared-memory region ", absl::StrJoin(busy, ", "),
        " is in use by requests; nothing was unregistered, expected no "
        "request in flight: unregister after they return"));
  }
  for (const std::string& n : names) regions_.erase(n);
  PublishLocked();
  return absl::OkStatus();
}

absl::StatusOr<std::vector<SharedMemoryRegionInfo>>
SharedMemoryRegistry::Status(absl::string_view client,
                             absl::string_view name) const {
  absl::ReaderMutexLock lock(&mu_);
  std::vector<std::shared_ptr<SharedMemoryRegion>> found;
  if (name.empty()) {
    for (const auto& [region_name, region] : regions_) {
      if (region->owner == client) found.push_back(region);
    }
  } else {
    absl::StatusOr<std::shared_ptr<SharedMemoryRegion>> region =
        FindLocked(client, name);
    if (!region.ok()) return region.status();
    found.push_back(*std::move(region));
  }
  std::vector<SharedMemoryRegionInfo> infos;
  for (const auto& region : found) {
    if (region->cuda != nullptr) {
      infos.push_back({region->name, "cuda", region->cuda->byte_size(),
                       absl::StrCat("cuda:", region->cuda->device_id()),
                       region->in_flight.load(),
                       region->lock != nullptr ? region->lock->key() : ""});
    } else {
      infos.push_back({region->name, "system", region->mapping->bytes().size(),
                       region->mapping->key(), region->in_flight.load()});
    }
  }
  return infos;
}

absl::StatusOr<SharedMemorySlice> SharedMemoryRegistry::Acquire(
    absl::string_view client, absl::string_view name, uint64_t offset,
    uint64_t byte_size) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<std::shared_ptr<SharedMemoryRegion>> region =
      FindLocked(client, name);
  if (!region.ok()) return region.status();
  const uint64_t size = (*region)->byte_size();
  if (offset > size || byte_size > size - offset) {
    return absl::InvalidArgumentError(
        absl::StrCat("slice offset ", offset, " byte_size ", byte_size,
                     " of shared-memory region '", name, "' ends past its ",
                     size, " bytes, expected offset + byte_size <= ", size));
  }
  if ((*region)->cuda != nullptr) {
    // No host address: the span only carries the slice's size.
    return SharedMemorySlice(*region, absl::Span<char>(nullptr, byte_size),
                             offset);
  }
  const absl::Span<char> bytes = (*region)->mapping->bytes();
  if (absl::Status backed = (*region)->mapping->CheckStillBacked();
      !backed.ok()) {
    return backed;
  }
  return SharedMemorySlice(*region, bytes.subspan(offset, byte_size), offset);
}

int SharedMemoryRegistry::ReclaimAbandoned() {
  std::vector<std::shared_ptr<SharedMemoryRegion>> candidates;
  {
    absl::ReaderMutexLock lock(&mu_);
    for (const auto& [name, region] : regions_) candidates.push_back(region);
  }
  // flock() outside the lock: requests keep acquiring slices meanwhile.
  std::vector<std::shared_ptr<SharedMemoryRegion>> abandoned;
  for (auto& region : candidates) {
    const MappedRegion* held =
        region->mapping != nullptr ? region->mapping.get() : region->lock.get();
    if (held == nullptr) continue;  // CUDA without a lock: unregistered only
    absl::StatusOr<bool> alive = held->CreatorAlive();
    if (alive.ok() && !*alive) abandoned.push_back(std::move(region));
  }
  if (abandoned.empty()) return 0;
  int reclaimed = 0;
  {
    absl::MutexLock lock(&mu_);
    for (auto& region : abandoned) {
      auto it = regions_.find(region->name);
      // A region re-registered under the same name meanwhile is not this
      // one.
      if (it != regions_.end() && it->second == region) {
        regions_.erase(it);
        ++reclaimed;
      } else {
        region.reset();
      }
    }
    metrics_->CountSharedMemoryReclaimed(reclaimed);
    PublishLocked();
  }
  // A creator that died without unlinking (SIGKILL, or Python's default
  // SIGTERM, which runs no cleanup) left its object's name in /dev/shm,
  // and with it the pages: nobody else would free them.
  for (const auto& region : abandoned) {
    if (region == nullptr) continue;
    const MappedRegion* held =
        region->mapping != nullptr ? region->mapping.get() : region->lock.get();
    absl::StatusOr<bool> unlinked = held->UnlinkName();
    if (!unlinked.ok()) {
      std::fprintf(stderr,
                   "gradcompd: reclaimed shared-memory region '%s': %s\n",
                   region->name.c_str(),
                   std::string(unlinked.status().message()).c_str());
    }
  }
  return reclaimed;
}

void SharedMemoryRegistry::PublishLocked() {
  uint64_t bytes = 0;
  for (const auto& [name, region] : regions_) {
    bytes += region->byte_size();
  }
  metrics_->SetSharedMemory(regions_.size(), bytes);
}

}  // namespace gradcomp::service
