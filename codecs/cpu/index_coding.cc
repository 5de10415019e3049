#include "codecs/cpu/index_coding.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace gradcomp::codecs {
namespace {

constexpr int kMaxWidth = 32;

int BitWidth(uint32_t v) { return v == 0 ? 0 : 32 - __builtin_clz(v); }

size_t PackedBytes(size_t count, int width) {
  return (count * static_cast<size_t>(width) + 7) / 8;
}

// Gap before position j: i_j - i_{j-1} - 1, with i_{-1} = -1.
uint32_t Gap(absl::Span<const uint32_t> indices, size_t j) {
  return j == 0 ? indices[0] : indices[j] - indices[j - 1] - 1;
}

}  // namespace

IndexPlan PlanIndices(absl::Span<const uint32_t> indices) {
  IndexPlan plan;
  const size_t blocks = (indices.size() + kIndexBlock - 1) / kIndexBlock;
  plan.widths.resize(blocks);
  plan.bytes = blocks;
  for (size_t b = 0; b < blocks; ++b) {
    const size_t end = std::min(indices.size(), (b + 1) * kIndexBlock);
    uint32_t widest = 0;
    for (size_t j = b * kIndexBlock; j < end; ++j) {
      widest |= Gap(indices, j);
    }
    plan.widths[b] = static_cast<uint8_t>(BitWidth(widest));
    plan.bytes += PackedBytes(end - b * kIndexBlock, plan.widths[b]);
  }
  return plan;
}

void EncodeIndices(absl::Span<const uint32_t> indices, const IndexPlan& plan,
                   char* out) {
  std::copy(plan.widths.begin(), plan.widths.end(), out);
  out += plan.widths.size();
  for (size_t b = 0; b < plan.widths.size(); ++b) {
    const int width = plan.widths[b];
    const size_t end = std::min(indices.size(), (b + 1) * kIndexBlock);
    uint64_t bits = 0;
    int filled = 0;
    for (size_t j = b * kIndexBlock; j < end; ++j) {
      bits |= static_cast<uint64_t>(Gap(indices, j)) << filled;
      filled += width;
      for (; filled >= 8; filled -= 8, bits >>= 8) {
        *out++ = static_cast<char>(bits & 0xFF);
      }
    }
    if (filled > 0) *out++ = static_cast<char>(bits);
  }
}

absl::StatusOr<size_t> DecodeIndices(absl::string_view in, size_t count,
                                     uint64_t numel,
                                     std::vector<uint32_t>* out) {
  const size_t blocks = (count + kIndexBlock - 1) / kIndexBlock;
  if (in.size() < blocks) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "indices: %d indices need %d width bytes, only %d bytes left", count,
        blocks, in.size()));
  }
  const uint8_t* widths = reinterpret_cast<const uint8_t*>(in.data());
  // Widths and the total length first, so that nothing is allocated for a
  // count the bytes cannot hold.
  size_t total = blocks;
  for (size_t b = 0; b < blocks; ++b) {
    if (widths[b] > kMaxWidth) {
      return absl::InvalidArgumentError(
          absl::StrFormat("indices: block %d has width %d; expected at most %d",
                          b, widths[b], kMaxWidth));
    }
    total += PackedBytes(
        std::min(count, (b + 1) * kIndexBlock) - b * kIndexBlock, widths[b]);
  }
  if (in.size() < total) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "indices: %d indices at their widths need %d bytes, only %d left",
        count, total, in.size()));
  }
  const uint8_t* data = widths + blocks;
  out->resize(count);
  int64_t previous = -1;
  for (size_t b = 0; b < blocks; ++b) {
    const int width = widths[b];
    const size_t begin = b * kIndexBlock;
    const size_t end = std::min(count, begin + kIndexBlock);
    const uint64_t mask = (uint64_t{1} << width) - 1;
    uint64_t bits = 0;
    int filled = 0;
    const uint8_t* p = data;
    for (size_t j = begin; j < end; ++j) {
      while (filled < width) {
        bits |= static_cast<uint64_t>(*p++) << filled;
        filled += 8;
      }
      const int64_t index = previous + 1 + static_cast<int64_t>(bits & mask);
      bits >>= width;
      filled -= width;
      if (static_cast<uint64_t>(index) >= numel ||
          index > int64_t{UINT32_MAX}) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "indices: index %d at position %d is not below numel %d and "
            "2^32",
            index, j, numel));
      }
      (*out)[j] = static_cast<uint32_t>(index);
      previous = index;
    }
    if (bits != 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("indices: block %d has nonzero padding bits", b));
    }
    data = p;
  }
  return total;
}

}  // namespace gradcomp::codecs
