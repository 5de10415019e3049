#include "codecs/state.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"

// Buffers are copied as they lie in memory, which is the format's order.
static_assert(
    __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
    "the state format is little-endian; add byte swaps for this host");

namespace gradcomp::codecs {
namespace {

// Export format, little-endian:
//   "GCST" u32 version
//   version 2: u32 rank, u32 world size (the exporter's; 0: unknown)
//   u32 tensor count, then per tensor:
//     str name, i32 dtype, [version 2: str owner,] u32 ndim, i64 dims[ndim],
//     u32 buffer count,
//     then per buffer: str name, u64 element count, f32 values[count]
//   str = u32 length + bytes.
// Version 1 (no origin, no owner) is still read.
constexpr char kStateMagic[4] = {'G', 'C', 'S', 'T'};
constexpr uint32_t kStateVersion = 2;

std::string Key(absl::string_view job, absl::string_view tensor) {
  return absl::StrCat(job, absl::string_view("\0", 1), tensor);
}

class Writer {
 public:
  void U32(uint32_t v) { Le(v, 4); }
  void U64(uint64_t v) { Le(v, 8); }
  void Str(absl::string_view s) {
    U32(static_cast<uint32_t>(s.size()));
    out_.append(s.data(), s.size());
  }
  void Floats(const std::vector<float>& v) {
    out_.append(reinterpret_cast<const char*>(v.data()),
                v.size() * sizeof(float));
  }
  void Raw(absl::string_view s) { out_.append(s.data(), s.size()); }
  Bytes Take() { return std::move(out_); }

 private:
  void Le(uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i)
      out_.push_back(static_cast<char>(v >> (8 * i)));
  }
  Bytes out_;
};

// Reads what Writer wrote, checking every length against what is left.
class Reader {
 public:
  explicit Reader(absl::string_view in) : in_(in) {}

  absl::Status Need(uint64_t bytes, absl::string_view what) {
    if (bytes > in_.size() - pos_) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "state blob: expected %d bytes of %s at offset %d, got %d", bytes,
          what, pos_, in_.size() - pos_));
    }
    return absl::OkStatus();
  }
  absl::StatusOr<uint64_t> Le(int bytes, absl::string_view what) {
    GC_RETURN_IF_ERROR(Need(bytes, what));
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) {
      v |= static_cast<uint64_t>(static_cast<unsigned char>(in_[pos_ + i]))
           << (8 * i);
    }
    pos_ += bytes;
    return v;
  }
  absl::StatusOr<std::string> Str(absl::string_view what) {
    GC_ASSIGN_OR_RETURN(uint64_t len, Le(4, what));
    GC_RETURN_IF_ERROR(Need(len, what));
    std::string s(in_.substr(pos_, len));
    pos_ += len;
    return s;
  }
  absl::StatusOr<std::vector<float>> Floats(uint64_t count,
                                            absl::string_view what) {
    if (count > (in_.size() - pos_) / 4) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "state blob: expected %d floats of %s at offset %d, got %d bytes",
          count, what, pos_, in_.size() - pos_));
    }
    std::vector<float> v(count);
    if (count > 0) std::memcpy(v.data(), in_.data() + pos_, count * 4);
    pos_ += count * 4;
    return v;
  }
  size_t left() const { return in_.size() - pos_; }

 private:
  absl::string_view in_;
  size_t pos_ = 0;
};

struct ImportedTensor {
  std::string name;
  int dtype = 0;
  std::string owner;
  std::vector<int64_t> shape;
  TensorState state;
};

absl::StatusOr<std::vector<ImportedTensor>> ParseBlob(
    absl::string_view blob, StateStore::Origin* origin) {
  Reader r(blob);
  GC_RETURN_IF_ERROR(r.Need(4, "magic"));
  if (blob.substr(0, 4) != absl::string_view(kStateMagic, 4)) {
    return absl::InvalidArgumentError(
        "state blob: expected magic \"GCST\", got other bytes");
  }
  GC_RETURN_IF_ERROR(r.Le(4, "magic").status());
  GC_ASSIGN_OR_RETURN(uint64_t version, r.Le(4, "version"));
  if (version != 1 && version != kStateVersion) {
    return absl::InvalidArgumentError(
        absl::StrFormat("state blob: expected version 1 or %d, got %d",
                        kStateVersion, version));
  }
  *origin = StateStore::Origin();
  if (version >= 2) {
    GC_ASSIGN_OR_RETURN(uint64_t rank, r.Le(4, "rank"));
    GC_ASSIGN_OR_RETURN(uint64_t world_size, r.Le(4, "world size"));
    if (world_size > std::numeric_limits<int>::max() ||
        (world_size > 0 && rank >= world_size)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "state blob: exported by rank %d of %d ranks, expected a rank "
          "below the world size",
          rank, world_size));
    }
    origin->rank = static_cast<int>(rank);
    origin->world_size = static_cast<int>(world_size);
  }
  GC_ASSIGN_OR_RETURN(uint64_t tensors, r.Le(4, "tensor count"));
  std::vector<ImportedTensor> out;
  for (uint64_t t = 0; t < tensors; ++t) {
    ImportedTensor tensor;
    GC_ASSIGN_OR_RETURN(tensor.name, r.Str("tensor name"));
    for (const ImportedTensor& seen : out) {
      if (seen.name == tensor.name) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "state blob: tensor '%s' appears twice", tensor.name));
      }
    }
    GC_ASSIGN_OR_RETURN(uint64_t dtype, r.Le(4, "dtype"));
    tensor.dtype = static_cast<int32_t>(static_cast<uint32_t>(dtype));
    if (version >= 2) {
      GC_ASSIGN_OR_RETURN(tensor.owner, r.Str("owner"));
    }
    GC_ASSIGN_OR_RETURN(uint64_t ndim, r.Le(4, "ndim"));
    if (ndim > r.left() / 8) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "state blob: tensor '%s' claims %d dimensions, more than the blob "
          "holds",
          tensor.name, ndim));
    }
    for (uint64_t d = 0; d < ndim; ++d) {
      GC_ASSIGN_OR_RETURN(uint64_t dim, r.Le(8, "dimension"));
      if (static_cast<int64_t>(dim) < 0) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "state blob: tensor '%s': expected dimensions >= 0, got %d",
            tensor.name, static_cast<int64_t>(dim)));
      }
      tensor.shape.push_back(static_cast<int64_t>(dim));
    }
    GC_ASSIGN_OR_RETURN(uint64_t buffers, r.Le(4, "buffer count"));
    for (uint64_t b = 0; b < buffers; ++b) {
      GC_ASSIGN_OR_RETURN(std::string name, r.Str("buffer name"));
      if (tensor.state.Find(name).has_value()) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "state blob: tensor '%s': buffer '%s' appears twice", tensor.name,
            name));
      }
      GC_ASSIGN_OR_RETURN(uint64_t count, r.Le(8, "buffer size"));
      GC_ASSIGN_OR_RETURN(std::vector<float> values,
                          r.Floats(count, "buffer values"));
      // A NaN or Inf in a residual or momentum would poison every later
      // step, and the next reduce would blame the gradient.
      const auto bad = std::find_if(values.begin(), values.end(),
                                    [](float v) { return !std::isfinite(v); });
      if (bad != values.end()) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "state blob: tensor '%s': buffer '%s' holds %f at index %d; "
            "expected finite state",
            tensor.name, name, *bad, bad - values.begin()));
      }
      absl::Span<float> dst = tensor.state.Buffer(name, values.size());
      std::copy(values.begin(), values.end(), dst.begin());
    }
    out.push_back(std::move(tensor));
  }
  if (r.left() != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "state blob: expected the end after %d tensors, got %d more bytes",
        tensors, r.left()));
  }
  return out;
}

}  // namespace

absl::Span<float> TensorState::Buffer(absl::string_view name, size_t size) {
  auto it = buffers_.find(name);
  if (it == buffers_.end()) {
    it = buffers_.emplace(std::string(name), std::vector<float>()).first;
  }
  if (it->second.size() != size) it->second.assign(size, 0.0f);
  return absl::MakeSpan(it->second);
}

std::optional<absl::Span<float>> TensorState::Find(absl::string_view name) {
  auto it = buffers_.find(name);
  if (it == buffers_.end()) return std::nullopt;
  return absl::MakeSpan(it->second);
}

void TensorState::Erase(absl::string_view name) {
  auto it = buffers_.find(name);
  if (it != buffers_.end()) buffers_.erase(it);
}

size_t TensorState::ByteSize() const {
  size_t bytes = 0;
  for (const auto& [name, values] : buffers_) {
    bytes += values.size() * sizeof(float);
  }
  return bytes;
}

StateStore::Locked::Locked(std::shared_ptr<Entry> entry)
    : entry_(std::move(entry)) {
  entry_->mu.Lock();
}

StateStore::Locked& StateStore::Locked::operator=(Locked&& other) {
  if (this != &other) {
    Release();
    entry_ = std::move(other.entry_);
    replaced_ = std::move(other.replaced_);
    other.replaced_.reset();
  }
  return *this;
}

void StateStore::Locked::RestoreIfReset() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  if (entry_ == nullptr || !replaced_.has_value()) return;
  entry_->state = std::move(replaced_->state);
  entry_->shape = std::move(replaced_->shape);
  entry_->dtype = replaced_->dtype;
  entry_->owner = std::move(replaced_->owner);
  replaced_.reset();
}

StateStore::Locked::~Locked() { Release(); }

void StateStore::Locked::Release() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  if (entry_ == nullptr) return;
  entry_->bytes.store(entry_->state.ByteSize(), std::memory_order_relaxed);
  entry_->mu.Unlock();
}

TensorState* StateStore::Locked::operator->() const { return &entry_->state; }
TensorState& StateStore::Locked::operator*() const { return entry_->state; }

// Shape and dtype are set before anyone else can see the entry, so a first
// Acquire never counts as a reset, and no tensor lock is ever taken while the
// store's lock is held (a thread holding one tensor may acquire another).
std::shared_ptr<StateStore::Entry> StateStore::NewEntry(
    absl::Span<const int64_t> shape, int dtype) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  auto entry = std::make_shared<Entry>();
  entry->shape.assign(shape.begin(), shape.end());
  entry->dtype = dtype;
  return entry;
}

StateStore::Locked StateStore::Acquire(absl::string_view job,
                                       absl::string_view tensor,
                                       absl::Span<const int64_t> shape,
                                       int dtype, absl::string_view owner) {
  std::shared_ptr<Entry> entry;
  {
    absl::MutexLock lock(&mu_);
    std::shared_ptr<Entry>& slot = entries_[Key(job, tensor)];
    if (slot == nullptr) slot = NewEntry(shape, dtype);
    entry = slot;
  }
  // The store's lock is released before the tensor's is taken: a thread that
  // holds a tensor for long never blocks access to the others.
  Locked locked(entry);
  const bool other_owner =
      !owner.empty() && !entry->owner.empty() && entry->owner != owner;
  if (entry->dtype != dtype || other_owner ||
      !std::equal(entry->shape.begin(), entry->shape.end(), shape.begin(),
                  shape.end())) {
    locked.replaced_ = Locked::Replaced{entry->shape, entry->dtype,
                                        entry->owner, std::move(entry->state)};
    entry->state = TensorState();
    entry->shape.assign(shape.begin(), shape.end());
    entry->dtype = dtype;
    resets_.fetch_add(1, std::memory_order_relaxed);
  }
  if (!owner.empty()) entry->owner = std::string(owner);
  return locked;
}

uint64_t StateStore::resets() const {
  return resets_.load(std::memory_order_relaxed);
}

size_t StateStore::ByteSize() const {
  absl::MutexLock lock(&mu_);
  size_t bytes = 0;
  for (const auto& [key, entry] : entries_) {
    bytes += entry->bytes.load(std::memory_order_relaxed);
  }
  return bytes;
}

size_t StateStore::ByteSizeOf(absl::string_view job,
                              absl::Span<const std::string> tensors) const {
  absl::MutexLock lock(&mu_);
  size_t bytes = 0;
  for (const std::string& tensor : tensors) {
    if (auto it = entries_.find(Key(job, tensor)); it != entries_.end()) {
      bytes += it->second->bytes.load(std::memory_order_relaxed);
    }
  }
  return bytes;
}

size_t StateStore::EraseJob(absl::string_view job) {
  const std::string prefix = Key(job, "");
  absl::MutexLock lock(&mu_);
  return absl::erase_if(entries_, [&prefix](const auto& entry) {
    return absl::StartsWith(entry.first, prefix);
  });
}

absl::StatusOr<Bytes> StateStore::Export(absl::string_view job,
                                         Origin origin) const {
  const std::string prefix = Key(job, "");
  std::vector<std::pair<std::string, std::shared_ptr<Entry>>> tensors;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [key, entry] : entries_) {
      if (absl::string_view(key).substr(0, prefix.size()) == prefix) {
        tensors.emplace_back(key.substr(prefix.size()), entry);
      }
    }
  }
  // Sorted, so that equal states export to equal bytes.
  std::sort(tensors.begin(), tensors.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  Writer w;
  w.Raw(absl::string_view(kStateMagic, 4));
  w.U32(kStateVersion);
  w.U32(static_cast<uint32_t>(origin.rank));
  w.U32(static_cast<uint32_t>(origin.world_size));
  w.U32(static_cast<uint32_t>(tensors.size()));
  for (const auto& [name, entry] : tensors) {
    absl::MutexLock lock(&entry->mu);
    w.Str(name);
    w.U32(static_cast<uint32_t>(entry->dtype));
    w.Str(entry->owner);
    w.U32(static_cast<uint32_t>(entry->shape.size()));
    for (int64_t dim : entry->shape) w.U64(static_cast<uint64_t>(dim));
    w.U32(static_cast<uint32_t>(entry->state.buffers().size()));
    for (const auto& [buffer, values] : entry->state.buffers()) {
      w.Str(buffer);
      w.U64(values.size());
      w.Floats(values);
    }
  }
  return w.Take();
}

absl::Status StateStore::Import(absl::string_view job, absl::string_view blob,
                                const ImportAdmission& admit, Origin importer) {
  Origin origin;
  GC_ASSIGN_OR_RETURN(std::vector<ImportedTensor> tensors,
                      ParseBlob(blob, &origin));
  if (origin.world_size != 0 && origin.world_size == importer.world_size &&
      origin.rank != importer.rank) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "state blob of job '%s' was exported by rank %d of %d, and this is "
        "rank %d: each rank's residuals, momenta and gossip edges are its "
        "own; expected the blob this rank exported (the torch hook's "
        "state_dict of this rank)",
        job, origin.rank, origin.world_size, importer.rank));
  }
  std::vector<ImportedSize> sizes;
  sizes.reserve(tensors.size());
  for (const ImportedTensor& tensor : tensors) {
    sizes.push_back({tensor.name, tensor.state.ByteSize()});
  }
  if (admit != nullptr) GC_RETURN_IF_ERROR(admit(sizes));
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (sizes[i].skip) continue;
    ImportedTensor& tensor = tensors[i];
    std::shared_ptr<Entry> entry;
    {
      absl::MutexLock lock(&mu_);
      std::shared_ptr<Entry>& slot = entries_[Key(job, tensor.name)];
      if (slot == nullptr) slot = std::make_shared<Entry>();
      entry = slot;
    }
    absl::MutexLock lock(&entry->mu);
    entry->shape = std::move(tensor.shape);
    entry->dtype = tensor.dtype;
    entry->owner = std::move(tensor.owner);
    entry->state = std::move(tensor.state);
    entry->bytes.store(entry->state.ByteSize(), std::memory_order_relaxed);
  }
  return absl::OkStatus();
}

}  // namespace gradcomp::codecs
