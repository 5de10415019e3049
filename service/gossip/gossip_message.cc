#include "service/gossip/gossip_message.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace gradcomp::service {
namespace {

constexpr uint32_t kMagic = 0x50534F47;  // "GOSP" little-endian
constexpr uint8_t kVersion = 1;

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
    default:
      return "unknown";
  }
}

}  // namespace

void WriteGossipMessage(const GossipMessageHeader& header,
                        absl::Span<const float> values, codecs::Bytes* out) {
  out->assign(kGossipHeaderBytes + values.size() * sizeof(float), '\0');
  char* p = out->data();
  Store(kMagic, 4, p);
  Store(kVersion, 1, p + 4);
  Store(static_cast<uint8_t>(header.kind), 1, p + 5);
  Store(header.rank, 4, p + 8);
  Store(header.power_step, 8, p + 16);
  Store(values.size(), 8, p + 24);
  if (!values.empty()) {
    std::memcpy(p + kGossipHeaderBytes, values.data(),
                values.size() * sizeof(float));
  }
}

absl::Status ReadGossipMessage(absl::string_view bytes,
                               const GossipMessageHeader& expected,
                               absl::Span<float> out) {
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
  if (Load(p + 6, 2) != 0 || Load(p + 12, 4) != 0) {
    return absl::InvalidArgumentError(
        "gossip message has non-zero reserved bytes");
  }
  const uint64_t kind = Load(p + 5, 1);
  const uint64_t rank = Load(p + 8, 4);
  const uint64_t step = Load(p + 16, 8);
  const uint64_t count = Load(p + 24, 8);
  if (step != expected.power_step) {
    return absl::InvalidArgumentError(absl::StrCat(
        "neighbour is at power step ", step, " of this edge, this end at ",
        expected.power_step,
        "; both ends must run the same steps (was one restarted without its "
        "gossip state?)"));
  }
  if (kind != static_cast<uint64_t>(expected.kind) || rank != expected.rank) {
    return absl::InvalidArgumentError(absl::StrCat(
        "neighbour sent a ", KindName(kind), " message of rank ", rank,
        ", expected ", KindName(static_cast<uint64_t>(expected.kind)),
        " of rank ", expected.rank,
        "; expected the same gossip options on "
        "both ends of an edge"));
  }
  if (count != expected.count || count != out.size() ||
      (bytes.size() - kGossipHeaderBytes) / sizeof(float) != count ||
      (bytes.size() - kGossipHeaderBytes) % sizeof(float) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gossip message of ", bytes.size(), " bytes says ", count,
        " values; expected ", expected.count, " values (",
        kGossipHeaderBytes + expected.count * sizeof(float),
        " bytes): does the neighbour's tensor have the same shape?"));
  }
  if (count > 0) {
    std::memcpy(out.data(), p + kGossipHeaderBytes, count * sizeof(float));
  }
  return absl::OkStatus();
}

}  // namespace gradcomp::service
