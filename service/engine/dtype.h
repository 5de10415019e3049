// Element types a client may send, and their conversion to and from the
// fp32 that codecs compute in. Values mirror gradcomp.v1.DType so the API
// layer converts with a cast; anything else is rejected by DTypeBytes.
//
//   GC_ASSIGN_OR_RETURN(size_t width, DTypeBytes(dtype));
//   std::vector<float> values(numel);
//   GC_RETURN_IF_ERROR(DecodeToFloat(dtype, data, absl::MakeSpan(values)));
#ifndef GRADCOMP_SERVICE_ENGINE_DTYPE_H_
#define GRADCOMP_SERVICE_ENGINE_DTYPE_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace gradcomp::service {

enum class DType : int {
  kUnspecified = 0,
  kFloat32 = 1,
  kFloat16 = 2,
  kBFloat16 = 3,
  kFloat64 = 4,
};

// "float32", "float16", "bfloat16", "float64", or "dtype(N)" for others.
std::string DTypeName(DType dtype);

// The smallest fp32 magnitude that EncodeFromFloat turns into +-Inf in
// `dtype` (round to nearest even): 65520 for float16, 0x1.fep127 plus half
// an ulp for bfloat16, Inf for float32 and float64 (fp32 holds no larger
// finite value to convert).
float FirstMagnitudeToInf(DType dtype);

// Bytes per element; InvalidArgument naming the accepted types for
// kUnspecified and unknown values.
absl::StatusOr<size_t> DTypeBytes(DType dtype);

// out[i] = fp32(element i of `data`). `data` holds exactly out.size()
// elements of `dtype` (checked), little-endian, with no alignment needed.
// fp64 values outside the fp32 range become +-Inf, as a cast would.
absl::Status DecodeToFloat(DType dtype, absl::string_view data,
                           absl::Span<float> out);

// `values` converted to `dtype` (round to nearest even), as raw bytes.
absl::StatusOr<std::string> EncodeFromFloat(DType dtype,
                                            absl::Span<const float> values);

// As EncodeFromFloat, into a caller's buffer (a shared-memory slice, a
// pooled response) that must hold exactly values.size() elements of
// `dtype` (checked: InvalidArgument, nothing written); no alignment needed.
absl::Status EncodeFromFloatInto(DType dtype, absl::Span<const float> values,
                                 absl::Span<char> out);

}  // namespace gradcomp::service

#endif  // GRADCOMP_SERVICE_ENGINE_DTYPE_H_
