// A whole file's bytes, read with POSIX calls: an ifstream's rdbuf copy
// swallows a read error, and a directory opens and reads as "" (a config or
// a policy given a directory was read as empty and applied).
//
//   GC_ASSIGN_OR_RETURN(std::string text, ReadFileBytes(path));
#ifndef GRADCOMP_BASE_FILE_BYTES_H_
#define GRADCOMP_BASE_FILE_BYTES_H_

#include <string>

#include "absl/status/statusor.h"

namespace gradcomp {

// The whole contents of a file: NotFound if it cannot be opened (the
// message names the path and errno's reason), InvalidArgument for a
// directory, DataLoss for a read error.
absl::StatusOr<std::string> ReadFileBytes(const std::string& path);

}  // namespace gradcomp

#endif  // GRADCOMP_BASE_FILE_BYTES_H_
