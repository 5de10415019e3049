// Reads and writes NumPy .npy files holding little-endian float16, float32 or
// float64 arrays in C order: the format gradcompctl takes tensors in and
// writes results out.
//
//   GC_ASSIGN_OR_RETURN(NpyArray a, ReadNpyFile("grad.npy"));
//   // a.dtype, a.shape, a.data (raw little-endian bytes)
//   GC_RETURN_IF_ERROR(WriteNpyFile("out.npy", a));
//
// Headers are validated: anything else (big-endian, Fortran order, other
// element types, a data length that does not match the shape) is an
// InvalidArgument that says what was expected.
#ifndef GRADCOMP_CLIENT_CPP_NPY_H_
#define GRADCOMP_CLIENT_CPP_NPY_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gradcomp::client {

enum class NpyDType { kFloat16, kFloat32, kFloat64 };

// Bytes per element of `dtype`.
size_t NpyItemSize(NpyDType dtype);
// The NumPy descr string, e.g. "<f4".
absl::string_view NpyDescr(NpyDType dtype);

struct NpyArray {
  NpyDType dtype = NpyDType::kFloat32;
  std::vector<int64_t> shape;  // empty: a scalar
  std::string data;            // numel * itemsize bytes, little-endian, C order
};

// Elements of `shape` (1 for a scalar); InvalidArgument on a negative
// dimension or an element count that overflows.
absl::StatusOr<int64_t> NumElements(const std::vector<int64_t>& shape);

// Parses the contents of a .npy file (format versions 1.0, 2.0 and 3.0).
absl::StatusOr<NpyArray> ParseNpy(absl::string_view file);
// Serializes as format version 1.0 (2.0 if the header needs it).
// InvalidArgument if data's length does not match shape and dtype.
absl::StatusOr<std::string> SerializeNpy(const NpyArray& array);

// Creates or replaces `path` with `bytes`; a regular file that was there
// is replaced only once the new bytes are written in full (through a
// temporary file of the call's own beside it and a rename), and keeps its
// permission bits. A symbolic link is written through: the file it names
// is replaced, the link stays. Thread-safe: concurrent calls leave one
// call's bytes.
absl::Status WriteFileBytes(const std::string& path, absl::string_view bytes);

absl::StatusOr<NpyArray> ReadNpyFile(const std::string& path);
absl::Status WriteNpyFile(const std::string& path, const NpyArray& array);

}  // namespace gradcomp::client

#endif  // GRADCOMP_CLIENT_CPP_NPY_H_
