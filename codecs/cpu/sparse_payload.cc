#include "codecs/cpu/sparse_payload.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "codecs/cpu/index_coding.h"

namespace gradcomp::codecs {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the payload is written with host-order memcpy");

constexpr uint8_t kIndexDeltaPacked = 1;  // index_coding.h
constexpr size_t kParamBytes = 8;

}  // namespace

char* BeginSparsePayload(CodecId codec, uint64_t numel,
                         absl::Span<const uint32_t> indices, Bytes* out) {
  const uint32_t count = static_cast<uint32_t>(indices.size());
  const IndexPlan plan = PlanIndices(indices);
  char params[kParamBytes] = {static_cast<char>(kIndexDeltaPacked)};
  std::memcpy(params + 4, &count, sizeof(count));
  WireHeader header;
  header.codec = codec;
  header.numel = numel;
  char* body = BeginPayload(header, absl::string_view(params, kParamBytes),
                            plan.bytes + sizeof(float) * count, out);
  EncodeIndices(indices, plan, body);
  return body + plan.bytes;
}

void WriteSparsePayload(CodecId codec, uint64_t numel,
                        absl::Span<const uint32_t> indices,
                        absl::Span<const float> values, Bytes* out) {
  char* body_values = BeginSparsePayload(codec, numel, indices, out);
  if (!values.empty()) {
    std::memcpy(body_values, values.data(), sizeof(float) * values.size());
  }
}

absl::StatusOr<SparsePairs> ParseSparsePayload(absl::string_view payload,
                                               CodecId codec,
                                               absl::string_view name,
                                               uint64_t numel) {
  GC_ASSIGN_OR_RETURN(const ParsedPayload parsed,
                      ParsePayload(payload, codec, /*round=*/0, numel));
  if (parsed.header.flags != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: expected header flags 0 (not a dense body), got 0x%02x", name,
        parsed.header.flags));
  }
  if (parsed.params.size() != kParamBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: expected %d parameter bytes, got %d", name,
                        kParamBytes, parsed.params.size()));
  }
  const char* params = parsed.params.data();
  if (static_cast<uint8_t>(params[0]) != kIndexDeltaPacked || params[1] != 0 ||
      params[2] != 0 || params[3] != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: expected index coding %d with zero padding, got bytes %d %d %d "
        "%d",
        name, kIndexDeltaPacked, static_cast<uint8_t>(params[0]),
        static_cast<uint8_t>(params[1]), static_cast<uint8_t>(params[2]),
        static_cast<uint8_t>(params[3])));
  }
  uint32_t count32;
  std::memcpy(&count32, params + 4, sizeof(count32));
  const uint64_t count = count32;
  if (count > numel) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: payload holds %d pairs, more than the tensor's %d elements", name,
        count, numel));
  }
  SparsePairs pairs;
  GC_ASSIGN_OR_RETURN(const size_t index_bytes,
                      DecodeIndices(parsed.body, count, numel, &pairs.indices));
  if (parsed.body.size() - index_bytes != sizeof(float) * count) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: %d values need %d bytes after the indices, got %d", name, count,
        sizeof(float) * count, parsed.body.size() - index_bytes));
  }
  pairs.values = parsed.body.substr(index_bytes);
  // Encoders refuse NaN and Inf (as the daemon refuses them from clients),
  // so a peer's non-finite value is a bad payload, not a gradient: added to
  // an average it would reach every worker's model.
  for (size_t j = 0; j < count; ++j) {
    const float value = pairs.value(j);
    if (!(std::fabs(value) <= std::numeric_limits<float>::max())) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: value %d of %d (at index %d) is %g; expected finite values",
          name, j, count, pairs.indices[j], value));
    }
  }
  return pairs;
}

void AddSparsePairs(const SparsePairs& pairs, float alpha,
                    absl::Span<float> acc) {
  for (size_t j = 0; j < pairs.indices.size(); ++j) {
    acc[pairs.indices[j]] += alpha * pairs.value(j);
  }
}

absl::Status AddSparsePayload(absl::string_view payload, CodecId codec,
                              absl::string_view name, float alpha,
                              absl::Span<float> acc) {
  GC_ASSIGN_OR_RETURN(const SparsePairs pairs,
                      ParseSparsePayload(payload, codec, name, acc.size()));
  AddSparsePairs(pairs, alpha, acc);
  return absl::OkStatus();
}

}  // namespace gradcomp::codecs
