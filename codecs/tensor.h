// Views of fp32 tensors as codecs see them. Codecs compute in fp32; the daemon
// converts fp16/bf16/fp64 inputs at its boundary.
#ifndef GRADCOMP_CODECS_TENSOR_H_
#define GRADCOMP_CODECS_TENSOR_H_

#include <cstdint>
#include <string>

#include "absl/types/span.h"

namespace gradcomp::codecs {

// Payload bytes. std::string so that protobuf `bytes` fields take it by move.
using Bytes = std::string;

// A read-only fp32 tensor: values in row-major order and its shape.
struct TensorView {
  absl::Span<const float> values;
  absl::Span<const int64_t> shape;

  size_t numel() const { return values.size(); }
  int ndim() const { return static_cast<int>(shape.size()); }
  // Rows of the tensor seen as a matrix shape[0] x rest (1 for scalars).
  int64_t rows() const { return shape.empty() ? 1 : shape[0]; }
};

}  // namespace gradcomp::codecs

#endif  // GRADCOMP_CODECS_TENSOR_H_
