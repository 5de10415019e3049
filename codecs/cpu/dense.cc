#include "codecs/cpu/dense.h"

#include <cmath>
#include <memory>
#include <utility>

#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "codecs/codec.h"
#include "codecs/cpu/half.h"
#include "codecs/wire.h"

namespace gradcomp::codecs {
namespace {

// Parameter block (docs/wire-format.md): element type, three zero bytes, and
// the u32 divisor d the values were divided by before the cast (1 when not
// prescaled). Decoding multiplies by d.
constexpr size_t kDenseParamsBytes = 8;

struct DenseKind {
  const char* name;
  CodecId id;
};

DenseKind KindOf(ElemType type) {
  switch (type) {
    case ElemType::kF16:
      return {"fp16", CodecId::kFp16};
    case ElemType::kBF16:
      return {"bf16", CodecId::kBf16};
    case ElemType::kF32:
      break;
  }
  return {"none", CodecId::kNone};
}

class DenseCodec : public SingleRoundCodec {
 public:
  DenseCodec(CodecInfo info, ElemType type, bool prescale)
      : info_(std::move(info)), type_(type), prescale_(prescale) {}

  const CodecInfo& info() const override { return info_; }

  absl::Status Encode(const TensorView& grad, TensorState& /*state*/,
                      const StepContext& ctx, Bytes* payload) const override {
    if (ctx.world_size < 1) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: expected a world size >= 1, got %d", info_.name,
                          ctx.world_size));
    }
    const uint32_t divisor =
        prescale_ ? static_cast<uint32_t>(ctx.world_size) : 1;
    char params[kDenseParamsBytes] = {static_cast<char>(type_)};
    for (int i = 0; i < 4; ++i)
      params[4 + i] = static_cast<char>(divisor >> (8 * i));

    WireHeader header;
    header.codec = info_.id;
    header.flags = kFlagDenseBody;
    header.numel = grad.numel();
    BeginPayloadForAppend(header, absl::string_view(params, sizeof(params)),
                          grad.numel() * ElemTypeBytes(type_), payload);
    AppendDenseValues(type_, grad.values, 1.0f / static_cast<float>(divisor),
                      payload);
    return absl::OkStatus();
  }

  absl::Status DecodeAdd(absl::string_view payload, float alpha,
                         absl::Span<float> acc) const override {
    GC_ASSIGN_OR_RETURN(const DensePayload parsed,
                        ParseDensePayload(payload, type_, acc.size()));
    const float scale = alpha * static_cast<float>(parsed.divisor);
    switch (type_) {
      case ElemType::kF32:
        AddFloat(parsed.body.data(), scale, acc);
        break;
      case ElemType::kF16:
        AddHalf(parsed.body.data(), scale, acc);
        break;
      case ElemType::kBF16:
        AddBf16(parsed.body.data(), scale, acc);
        break;
    }
    return absl::OkStatus();
  }

  absl::Status FinishSum(absl::Span<const float> sum, int world_size,
                         const StepContext& ctx,
                         absl::Span<float> out) const override {
    if (!prescale_) {
      return SingleRoundCodec::FinishSum(sum, world_size, ctx, out);
    }
    if (world_size != ctx.world_size) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: prescaled by world size %d, expected a sum over as many "
          "workers, got %d",
          info_.name, ctx.world_size, world_size));
    }
    if (sum.size() != out.size()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: expected a sum of %d elements, got %d",
                          info_.name, out.size(), sum.size()));
    }
    // Every body was divided by W already: the sum is the average.
    if (sum.data() != out.data())
      std::copy(sum.begin(), sum.end(), out.begin());
    return absl::OkStatus();
  }

  // Both FinishSums write element i from element i alone.
  bool FinishSumInPlace() const override { return true; }

 private:
  const CodecInfo info_;
  const ElemType type_;
  const bool prescale_;
};

CodecInfo DenseInfo(ElemType type, bool exact) {
  const DenseKind kind = KindOf(type);
  CodecInfo info;
  info.name = kind.name;
  info.id = kind.id;
  info.family = "dense";
  info.summable = true;
  // Rounding to nearest is deterministic, so fp16/bf16 are (slightly) biased.
  info.unbiased = exact;
  info.stateful = false;
  info.rounds = 1;
  info.params = {"prescale"};
  return info;
}

absl::Status RegisterOne(CodecRegistry& registry, ElemType type, bool exact) {
  CodecInfo info = DenseInfo(type, exact);
  CodecFactory factory =
      [info, type](
          const CodecParams& params) -> absl::StatusOr<std::unique_ptr<Codec>> {
    GC_ASSIGN_OR_RETURN(bool prescale, params.GetBool("prescale", false));
    return std::unique_ptr<Codec>(
        std::make_unique<DenseCodec>(info, type, prescale));
  };
  return registry.Register(std::move(info), std::move(factory));
}

}  // namespace

absl::StatusOr<DensePayload> ParseDensePayload(absl::string_view payload,
                                               ElemType type, size_t n) {
  const DenseKind kind = KindOf(type);
  GC_ASSIGN_OR_RETURN(const ParsedPayload parsed,
                      ParsePayload(payload, kind.id, /*round=*/0, n));
  const absl::string_view p = parsed.params;
  if (p.size() != kDenseParamsBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s payload: expected %d parameter bytes, got %d",
                        kind.name, kDenseParamsBytes, p.size()));
  }
  if (static_cast<uint8_t>(p[0]) != static_cast<uint8_t>(type)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s payload: expected element type %d, got %d", kind.name,
        static_cast<int>(type), static_cast<uint8_t>(p[0])));
  }
  if (p[1] != 0 || p[2] != 0 || p[3] != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s payload: expected reserved parameter bytes 1-3 to be 0",
        kind.name));
  }
  uint32_t divisor = 0;
  for (int i = 0; i < 4; ++i) {
    divisor |= static_cast<uint32_t>(static_cast<unsigned char>(p[4 + i]))
               << (8 * i);
  }
  if (divisor == 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s payload: expected a prescale divisor >= 1, got 0", kind.name));
  }
  // The flag and body checks of AddDenseBody (codecs/wire.h).
  GC_ASSIGN_OR_RETURN(const size_t elements, DenseBodyElements(parsed));
  if (elements != n) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "payload: expected a dense body of %d elements of %d bytes, got %d "
        "bytes",
        n, ElemTypeBytes(type), parsed.body.size()));
  }
  return DensePayload{divisor, parsed.body};
}

absl::Status RegisterDenseCodecs(CodecRegistry& registry) {
  GC_RETURN_IF_ERROR(RegisterOne(registry, ElemType::kF32, /*exact=*/true));
  GC_RETURN_IF_ERROR(RegisterOne(registry, ElemType::kF16, /*exact=*/false));
  return RegisterOne(registry, ElemType::kBF16, /*exact=*/false);
}

}  // namespace gradcomp::codecs
