#include "service/engine/dtype.h"

#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "codecs/cpu/half.h"

namespace gradcomp::service {

float FirstMagnitudeToInf(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return 65520.0f;  // halfway from 65504 to 65536, which is even: up
    case DType::kBFloat16:
      return 0x1.ff0000p127f;  // halfway from 0x1.fep127 to 2^128: up
    default:
      return std::numeric_limits<float>::infinity();
  }
}

std::string DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kFloat64:
      return "float64";
    case DType::kUnspecified:
      return "unspecified";
  }
  return absl::StrCat("dtype(", static_cast<int>(dtype), ")");
}

absl::StatusOr<size_t> DTypeBytes(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return 4;
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
    case DType::kFloat64:
      return 8;
    case DType::kUnspecified:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("dtype is ", DTypeName(dtype),
                   ", expected one of float32, float16, bfloat16, float64"));
}

absl::Status DecodeToFloat(DType dtype, absl::string_view data,
                           absl::Span<float> out) {
  GC_ASSIGN_OR_RETURN(size_t width, DTypeBytes(dtype));
  if (data.size() != out.size() * width) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data has ", data.size(), " bytes, expected ", out.size() * width, " (",
        out.size(), " x ", DTypeName(dtype), ")"));
  }
  switch (dtype) {
    case DType::kFloat32:
      std::memcpy(out.data(), data.data(), data.size());
      break;
    case DType::kFloat16:
      codecs::HalfToFloat(data.data(), out);
      break;
    case DType::kBFloat16:
      codecs::Bf16ToFloat(data.data(), out);
      break;
    case DType::kFloat64:
      for (size_t i = 0; i < out.size(); ++i) {
        double d;
        std::memcpy(&d, data.data() + i * sizeof(double), sizeof(double));
        // A cast of a double beyond the fp32 range is undefined behaviour in
        // C++; saturate to Inf as an IEEE conversion would.
        constexpr double kMax = std::numeric_limits<float>::max();
        constexpr float kInf = std::numeric_limits<float>::infinity();
        out[i] = d > kMax ? kInf : d < -kMax ? -kInf : static_cast<float>(d);
      }
      break;
    case DType::kUnspecified:
      break;  // DTypeBytes rejected it above.
  }
  return absl::OkStatus();
}

absl::Status EncodeFromFloatInto(DType dtype, absl::Span<const float> values,
                                 absl::Span<char> out) {
  GC_ASSIGN_OR_RETURN(size_t width, DTypeBytes(dtype));
  if (out.size() != values.size() * width) {
    return absl::InvalidArgumentError(
        absl::StrCat("output buffer has ", out.size(), " bytes, expected ",
                     values.size() * width, " (", values.size(), " x ",
                     DTypeName(dtype), ")"));
  }
  switch (dtype) {
    case DType::kFloat32:
      std::memcpy(out.data(), values.data(), out.size());
      break;
    case DType::kFloat16:
      codecs::FloatToHalf(values, 1.0f, out.data());
      break;
    case DType::kBFloat16:
      codecs::FloatToBf16(values, 1.0f, out.data());
      break;
    case DType::kFloat64:
      for (size_t i = 0; i < values.size(); ++i) {
        const double d = values[i];
        std::memcpy(out.data() + i * sizeof(double), &d, sizeof(double));
      }
      break;
    case DType::kUnspecified:
      break;  // DTypeBytes rejected it above.
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> EncodeFromFloat(DType dtype,
                                            absl::Span<const float> values) {
  GC_ASSIGN_OR_RETURN(size_t width, DTypeBytes(dtype));
  std::string out(values.size() * width, '\0');
  GC_RETURN_IF_ERROR(EncodeFromFloatInto(
      dtype, values, absl::MakeSpan(out.data(), out.size())));
  return out;
}

}  // namespace gradcomp::service
