#include "codecs/wire.h"

#include <cstring>
#include <string>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "codecs/cpu/half.h"

// Dense bodies are converted straight into (and read from) the payload.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the wire format is little-endian; add byte swaps for this host");

namespace gradcomp::codecs {
namespace {

// Header field offsets (wire.h).
constexpr size_t kOffMagic = 0;
constexpr size_t kOffVersion = 4;
constexpr size_t kOffCodec = 5;
constexpr size_t kOffRound = 6;
constexpr size_t kOffFlags = 7;
constexpr size_t kOffNumel = 8;
constexpr size_t kOffParamsLen = 16;
constexpr size_t kOffReserved = 20;
constexpr size_t kOffBodyLen = 24;

// Explicit little-endian stores and loads, independent of the host's order.
void PutLe(char* p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<char>(v >> (8 * i));
}

uint64_t GetLe(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) {
    v |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  }
  return v;
}

const char* KnownCodecName(uint8_t id) {
  switch (static_cast<CodecId>(id)) {
    case CodecId::kNone:
      return "none";
    case CodecId::kFp16:
      return "fp16";
    case CodecId::kBf16:
      return "bf16";
    case CodecId::kTopK:
      return "topk";
    case CodecId::kQsgd:
      return "qsgd";
    case CodecId::kRandomK:
      return "randomk";
    case CodecId::kThreshold:
      return "threshold";
    case CodecId::kTernGrad:
      return "terngrad";
    case CodecId::kInt8:
      return "int8";
    case CodecId::kSignSgd:
      return "signsgd";
    case CodecId::kEfSign:
      return "efsign";
    case CodecId::kSignum:
      return "signum";
    case CodecId::kOneBit:
      return "onebit";
    case CodecId::kPowerSgd:
      return "powersgd";
    case CodecId::kAtomo:
      return "atomo";
    case CodecId::kPolar:
      return "polar";
  }
  return nullptr;
}

bool KnownElemType(uint8_t t) {
  return t == static_cast<uint8_t>(ElemType::kF32) ||
         t == static_cast<uint8_t>(ElemType::kF16) ||
         t == static_cast<uint8_t>(ElemType::kBF16);
}

void WriteHeader(const WireHeader& header, size_t params_bytes,
                 size_t body_bytes, char* out) {
  PutLe(out + kOffMagic, kWireMagic, 4);
  out[kOffVersion] = static_cast<char>(kWireVersion);
  out[kOffCodec] = static_cast<char>(header.codec);
  out[kOffRound] = static_cast<char>(header.round);
  out[kOffFlags] = static_cast<char>(header.flags);
  PutLe(out + kOffNumel, header.numel, 8);
  PutLe(out + kOffParamsLen, params_bytes, 4);
  PutLe(out + kOffReserved, 0, 4);
  PutLe(out + kOffBodyLen, body_bytes, 8);
}

}  // namespace

size_t ElemTypeBytes(ElemType t) {
  switch (t) {
    case ElemType::kF32:
      return 4;
    case ElemType::kF16:
      return 2;
    case ElemType::kBF16:
      return 2;
  }
  return 0;
}

void AdviseHugePages(void* data, size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  // Below a few huge pages the advice saves nothing.
  constexpr size_t kMinBytes = size_t{4} << 20;
  constexpr uintptr_t kPage = 4096;
  if (bytes < kMinBytes) return;
  const uintptr_t begin =
      (reinterpret_cast<uintptr_t>(data) + kPage - 1) & ~(kPage - 1);
  const uintptr_t end =
      (reinterpret_cast<uintptr_t>(data) + bytes) & ~(kPage - 1);
  // Only advice: if the kernel declines, the buffer works as before.
  madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#else
  (void)data;
  (void)bytes;
#endif
}

void BeginPayloadForAppend(const WireHeader& header, absl::string_view params,
                           size_t body_bytes, Bytes* out) {
  const size_t total = kWireHeaderBytes + params.size() + body_bytes;
  out->clear();
  if (out->capacity() < total) {
    Bytes fresh;
    fresh.reserve(total);
    AdviseHugePages(fresh.data(), total);
    out->swap(fresh);
  }
  out->resize(kWireHeaderBytes);
  WriteHeader(header, params.size(), body_bytes, out->data());
  out->append(params.data(), params.size());
}

char* BeginPayload(const WireHeader& header, absl::string_view params,
                   size_t body_bytes, Bytes* out) {
  BeginPayloadForAppend(header, params, body_bytes, out);
  const size_t head = out->size();
  out->resize(head + body_bytes);
  return out->data() + head;
}

void AppendDenseValues(ElemType type, absl::Span<const float> values,
                       float scale, Bytes* out) {
  if (type == ElemType::kF32 && scale == 1.0f) {
    out->append(reinterpret_cast<const char*>(values.data()),
                values.size() * sizeof(float));
    return;
  }
  // 16 KiB: stays in L1 between the conversion and the append.
  constexpr size_t kChunk = 4096;
  float buffer[kChunk];
  const size_t elem = ElemTypeBytes(type);
  for (size_t i = 0; i < values.size(); i += kChunk) {
    const absl::Span<const float> part = values.subspan(i, kChunk);
    switch (type) {
      case ElemType::kF32:
        ScaleFloat(part, scale, buffer);
        break;
      case ElemType::kF16:
        FloatToHalf(part, scale, buffer);
        break;
      case ElemType::kBF16:
        FloatToBf16(part, scale, buffer);
        break;
    }
    out->append(reinterpret_cast<const char*>(buffer), part.size() * elem);
  }
}

void WritePayload(const WireHeader& header, absl::string_view params,
                  absl::string_view body, Bytes* out) {
  BeginPayloadForAppend(header, params, body.size(), out);
  out->append(body.data(), body.size());
}

Bytes PayloadHead(const WireHeader& header, absl::string_view params,
                  size_t body_bytes) {
  Bytes out(kWireHeaderBytes + params.size(), '\0');
  WriteHeader(header, params.size(), body_bytes, out.data());
  if (!params.empty()) {
    std::memcpy(out.data() + kWireHeaderBytes, params.data(), params.size());
  }
  return out;
}

absl::StatusOr<ParsedPayload> PeekPayload(absl::string_view payload) {
  const size_t size = payload.size();
  if (size < kWireHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("payload: expected at least %d header bytes, got %d",
                        kWireHeaderBytes, size));
  }
  const char* p = payload.data();
  const uint32_t magic = static_cast<uint32_t>(GetLe(p + kOffMagic, 4));
  if (magic != kWireMagic) {
    return absl::InvalidArgumentError(
        absl::StrFormat("payload: expected magic 0x%08x (\"GCMP\"), got 0x%08x",
                        kWireMagic, magic));
  }
  const uint8_t version = static_cast<uint8_t>(p[kOffVersion]);
  if (version != kWireVersion) {
    return absl::InvalidArgumentError(
        absl::StrFormat("payload: expected wire format version %d, got %d",
                        kWireVersion, version));
  }
  const uint8_t codec = static_cast<uint8_t>(p[kOffCodec]);
  if (KnownCodecName(codec) == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrFormat("payload: unknown codec id %d", codec));
  }
  const uint8_t flags = static_cast<uint8_t>(p[kOffFlags]);
  if ((flags & ~kFlagDenseBody) != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("payload: expected flags within 0x%02x, got 0x%02x",
                        kFlagDenseBody, flags));
  }
  const uint32_t reserved = static_cast<uint32_t>(GetLe(p + kOffReserved, 4));
  if (reserved != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "payload: expected reserved header field 0, got %d", reserved));
  }
  // Lengths are compared against what is left, never summed, so that no
  // field value can overflow the arithmetic.
  const uint64_t params_len = GetLe(p + kOffParamsLen, 4);
  const uint64_t body_len = GetLe(p + kOffBodyLen, 8);
  const uint64_t after_header = size - kWireHeaderBytes;
  if (params_len > after_header) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "payload: parameter block of %d bytes exceeds the %d bytes after the "
        "header",
        params_len, after_header));
  }
  if (body_len != after_header - params_len) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "payload: expected body of %d bytes (payload %d = header %d + "
        "parameters %d + body), got body length %d",
        after_header - params_len, size, kWireHeaderBytes, params_len,
        body_len));
  }
  ParsedPayload parsed;
  parsed.header.codec = static_cast<CodecId>(codec);
  parsed.header.round = static_cast<uint8_t>(p[kOffRound]);
  parsed.header.flags = flags;
  parsed.header.numel = GetLe(p + kOffNumel, 8);
  parsed.params = payload.substr(kWireHeaderBytes, params_len);
  parsed.body = payload.substr(kWireHeaderBytes + params_len);

  if ((flags & kFlagDenseBody) != 0) {
    if (parsed.params.empty()) {
      return absl::InvalidArgumentError(
          "payload: dense body flag set, expected an element type as the "
          "first parameter byte, got no parameters");
    }
    const uint8_t type = static_cast<uint8_t>(parsed.params[0]);
    if (!KnownElemType(type)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "payload: expected dense element type 1 (f32), 2 (f16) or 3 (bf16), "
          "got %d",
          type));
    }
    // The body's element count is the codec's business (random-k sends k
    // values, PowerSGD a factor); here it must only be whole elements.
    const uint64_t elem = ElemTypeBytes(static_cast<ElemType>(type));
    if (body_len % elem != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "payload: expected a dense body of whole %d-byte elements, got %d "
          "bytes",
          elem, body_len));
    }
  }
  return parsed;
}

absl::StatusOr<ParsedPayload> ParsePayload(absl::string_view payload,
                                           CodecId codec, uint8_t round,
                                           uint64_t numel) {
  absl::StatusOr<ParsedPayload> parsed = PeekPayload(payload);
  if (!parsed.ok()) return parsed;
  const WireHeader& h = parsed->header;
  if (h.codec != codec) {
    const char* expected = KnownCodecName(static_cast<uint8_t>(codec));
    const char* got = KnownCodecName(static_cast<uint8_t>(h.codec));
    return absl::InvalidArgumentError(absl::StrFormat(
        "payload: expected codec '%s' (%d), got '%s' (%d)",
        expected != nullptr ? expected : "?", static_cast<int>(codec),
        got != nullptr ? got : "?", static_cast<int>(h.codec)));
  }
  if (h.round != round) {
    return absl::InvalidArgumentError(
        absl::StrFormat("payload: expected round %d, got %d", round, h.round));
  }
  if (h.numel != numel) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "payload: expected %d elements, got %d", numel, h.numel));
  }
  return parsed;
}

void WriteDensePayload(const WireHeader& header, ElemType type,
                       absl::Span<const float> values, Bytes* out) {
  WireHeader dense = header;
  dense.flags |= kFlagDenseBody;
  const char params[1] = {static_cast<char>(type)};
  BeginPayloadForAppend(dense, absl::string_view(params, 1),
                        values.size() * ElemTypeBytes(type), out);
  AppendDenseValues(type, values, 1.0f, out);
}

absl::StatusOr<size_t> DenseBodyElements(const ParsedPayload& payload) {
  if ((payload.header.flags & kFlagDenseBody) == 0 || payload.params.empty()) {
    return absl::InvalidArgumentError(
        "payload: expected a dense body (flag 0x01), got a codec-specific one");
  }
  const uint8_t type = static_cast<uint8_t>(payload.params[0]);
  if (!KnownElemType(type)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "payload: expected dense element type 1, 2 or 3, got %d", type));
  }
  const size_t elem = ElemTypeBytes(static_cast<ElemType>(type));
  if (payload.body.size() % elem != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "payload: dense body of %d bytes is not a whole number of %d-byte "
        "elements",
        payload.body.size(), elem));
  }
  return payload.body.size() / elem;
}

absl::Status AddDenseBody(const ParsedPayload& payload, float alpha,
                          absl::Span<float> acc) {
  GC_ASSIGN_OR_RETURN(const size_t elements, DenseBodyElements(payload));
  const auto type = static_cast<ElemType>(payload.params[0]);
  if (elements != acc.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "payload: expected a dense body of %d elements of %d bytes, got %d "
        "bytes",
        acc.size(), ElemTypeBytes(type), payload.body.size()));
  }
  switch (type) {
    case ElemType::kF32:
      AddFloat(payload.body.data(), alpha, acc);
      break;
    case ElemType::kF16:
      AddHalf(payload.body.data(), alpha, acc);
      break;
    case ElemType::kBF16:
      AddBf16(payload.body.data(), alpha, acc);
      break;
  }
  return absl::OkStatus();
}

}  // namespace gradcomp::codecs
