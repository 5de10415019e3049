#include "service/gossip/gossip_message.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/crc32c.h"
#include "base/status_macros.h"

namespace gradcomp::service {
namespace {

constexpr uint32_t kMagic = 0x50534F47;  // "GOSP" little-endian
constexpr uint8_t kVersion = 2;

void Store(uint64_t v, int bytes, char* p) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<char>(v >> (8 * i));
}
uint64_t Load(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) {
    v |= uint64_t{static_cast<unsigned char>(p[i])} << (8 * i);
  }
  return v;
}

const char* KindName(uint64_t kind) {
  switch (kind) {
    case static_cast<uint64_t>(GossipKind::kPlain):
      return "plain";
    case static_cast<uint64_t>(GossipKind::kLeft):
      return "X input (rows x r)";
    case static_cast<uint64_t>(GossipKind::kRight):
      return "X^T input (cols x r)";
    case static_cast<uint64_t>(GossipKind::kSparse):
      return "sparse (top-k)";
    default:
      return "unknown";
  }
}

void WriteHeader(const GossipMessageHeader& header, uint64_t count,
                 size_t body_bytes, codecs::Bytes* out) {
  out->assign(kGossipHeaderBytes + body_bytes, '\0');
  char* p = out->data();
  Store(kMagic, 4, p);
  Store(kVersion, 1, p + 4);
  Store(static_cast<uint8_t>(header.kind), 1, p + 5);
  Store(header.rank, 4, p + 8);
  Store(header.shape_hash, 4, p + 12);
  Store(header.power_step, 8, p + 16);
  Store(count, 8, p + 24);
}

// Checks everything but the body's contents: `entry_bytes` per counted
// value (4, or 8 for an index and a value).
absl::Status CheckHeader(absl::string_view bytes,
                         const GossipMessageHeader& expected,
                         size_t entry_bytes) {
  GC_ASSIGN_OR_RETURN(const GossipMessageHeader came, ReadGossipHeader(bytes));
  const uint64_t kind = static_cast<uint64_t>(came.kind);
  const uint64_t count = came.count;
  // The kind first: a neighbour whose tensor is 1-D where this one is a
  // matrix (plain gossip against low-rank) is at another step count too.
  if (came.kind != expected.kind || came.rank != expected.rank) {
    return absl::InvalidArgumentError(absl::StrCat(
        "neighbour sent a ", KindName(kind), " message of rank ", came.rank,
        ", expected ", KindName(static_cast<uint64_t>(expected.kind)),
        " of rank ", expected.rank,
        "; expected the same gossip options, and a tensor of the same "
        "shape (a matrix, or 1-D), on both ends of an edge"));
  }
  if (came.shape_hash != expected.shape_hash) {
    return absl::InvalidArgumentError(absl::StrCat(
        "neighbour's tensor has another shape (shape hash 0x",
        absl::Hex(came.shape_hash, absl::kZeroPad8), ", this end's 0x",
        absl::Hex(expected.shape_hash, absl::kZeroPad8),
        "); expected the same shape on both ends of an edge"));
  }
  if (came.power_step != expected.power_step) {
    return absl::InvalidArgumentError(absl::StrCat(
        "neighbour is at power step ", came.power_step,
        " of this edge, this end at ", expected.power_step,
        "; both ends must run the same steps (was one restarted without its "
        "gossip state?)"));
  }
  const size_t body = bytes.size() - kGossipHeaderBytes;
  if (count != expected.count || body / entry_bytes != count ||
      body % entry_bytes != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gossip message of ", bytes.size(), " bytes says ", count,
        " values; expected ", expected.count, " values (",
        kGossipHeaderBytes + expected.count * entry_bytes,
        " bytes): does the neighbour's tensor have the same shape?"));
  }
  return absl::OkStatus();
}

}  // namespace

uint32_t GossipShapeHash(absl::Span<const int64_t> shape) {
  uint32_t crc = 0;
  for (const int64_t d : shape) {
    char le[8];
    Store(static_cast<uint64_t>(d), 8, le);
    crc = Crc32cExtend(crc, le, sizeof(le));
  }
  return crc;
}

absl::StatusOr<GossipMessageHeader> ReadGossipHeader(absl::string_view bytes) {
  if (bytes.size() < kGossipHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gossip message of ", bytes.size(), " bytes is shorter than its ",
        kGossipHeaderBytes, "-byte header"));
  }
  const char* p = bytes.data();
  if (Load(p, 4) != kMagic || Load(p + 4, 1) != kVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a gossip message of version ", kVersion, " (magic ",
                     Load(p, 4), ", version ", Load(p + 4, 1), ")"));
  }
  if (Load(p + 6, 2) != 0) {
    return absl::InvalidArgumentError(
        "gossip message has non-zero reserved bytes");
  }
  GossipMessageHeader header;
  header.kind = static_cast<GossipKind>(Load(p + 5, 1));
  header.rank = static_cast<uint32_t>(Load(p + 8, 4));
  header.shape_hash = static_cast<uint32_t>(Load(p + 12, 4));
  header.power_step = Load(p + 16, 8);
  header.count = Load(p + 24, 8);
  return header;
}

void WriteGossipMessage(const GossipMessageHeader& header,
                        absl::Span<const float> values, codecs::Bytes* out) {
  WriteHeader(header, values.size(), values.size() * sizeof(float), out);
  if (!values.empty()) {
    std::memcpy(out->data() + kGossipHeaderBytes, values.data(),
                values.size() * sizeof(float));
  }
}

void WriteSparseGossipMessage(const GossipMessageHeader& header,
                              absl::Span<const uint32_t> indices,
                              absl::Span<const float> values,
                              codecs::Bytes* out) {
  const size_t n = indices.size();
  WriteHeader(header, n, n * (sizeof(uint32_t) + sizeof(float)), out);
  if (n > 0) {
    char* body = out->data() + kGossipHeaderBytes;
    std::memcpy(body, indices.data(), n * sizeof(uint32_t));
    std::memcpy(body + n * sizeof(uint32_t), values.data(), n * sizeof(float));
  }
}

absl::Status ReadGossipMessage(absl::string_view bytes,
                               const GossipMessageHeader& expected,
                               absl::Span<float> out) {
  if (expected.count != out.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("gossip message expected with ", expected.count,
                     " values into ", out.size()));
  }
  GC_RETURN_IF_ERROR(CheckHeader(bytes, expected, sizeof(float)));
  if (expected.count > 0) {
    std::memcpy(out.data(), bytes.data() + kGossipHeaderBytes,
                expected.count * sizeof(float));
  }
  return absl::OkStatus();
}

absl::Status ReadSparseGossipMessage(absl::string_view bytes,
                                     const GossipMessageHeader& expected,
                                     uint64_t size,
                                     absl::Span<uint32_t> indices,
                                     absl::Span<float> values) {
  const size_t n = expected.count;
  if (n != indices.size() || n != values.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sparse gossip message expected with ", n, " entries into ",
        indices.size(), " indices and ", values.size(), " values"));
  }
  GC_RETURN_IF_ERROR(
      CheckHeader(bytes, expected, sizeof(uint32_t) + sizeof(float)));
  const char* body = bytes.data() + kGossipHeaderBytes;
  uint64_t previous = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint64_t index = Load(body + i * sizeof(uint32_t), 4);
    if (index >= size || (i > 0 && index <= previous)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sparse gossip message entry ", i, " has index ", index,
          ", expected indices strictly increasing and below the tensor's ",
          size, " elements"));
    }
    previous = index;
  }
  if (n > 0) {
    std::memcpy(indices.data(), body, n * sizeof(uint32_t));
    std::memcpy(values.data(), body + n * sizeof(uint32_t), n * sizeof(float));
  }
  return absl::OkStatus();
}

}  // namespace gradcomp::service
