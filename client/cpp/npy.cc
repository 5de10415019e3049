#include "client/cpp/npy.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/file_bytes.h"
#include "base/status_macros.h"

namespace gradcomp::client {
namespace {

constexpr absl::string_view kMagic("\x93NUMPY", 6);
// Magic, two version bytes and the header length field of version 1.0.
constexpr size_t kV1PreambleBytes = 10;
// Version 2.0 and 3.0 use a 4-byte header length.
constexpr size_t kV2PreambleBytes = 12;
// NumPy pads the preamble + header to a multiple of this, for aligned data.
constexpr size_t kHeaderAlignment = 64;

uint32_t ReadLittleEndian(absl::string_view bytes) {
  uint32_t value = 0;
  for (size_t i = bytes.size(); i > 0; --i) {
    value = (value << 8) | static_cast<uint8_t>(bytes[i - 1]);
  }
  return value;
}

void AppendLittleEndian(uint32_t value, size_t bytes, std::string& out) {
  for (size_t i = 0; i < bytes; ++i) {
    out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
  }
}

// Parses the Python dict literal of a .npy header, e.g.
//   {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
// It accepts only the literal kinds such a header holds: strings, True/False
// and tuples of non-negative integers.
class HeaderParser {
 public:
  explicit HeaderParser(absl::string_view text) : text_(text) {}

  absl::Status Parse() {
    SkipSpace();
    GC_RETURN_IF_ERROR(Expect('{'));
    while (true) {
      SkipSpace();
      if (Consume('}')) break;
      GC_ASSIGN_OR_RETURN(std::string key, ParseString());
      SkipSpace();
      GC_RETURN_IF_ERROR(Expect(':'));
      SkipSpace();
      if (key == "descr") {
        GC_ASSIGN_OR_RETURN(descr_, ParseString());
      } else if (key == "fortran_order") {
        GC_ASSIGN_OR_RETURN(fortran_order_, ParseBool());
      } else if (key == "shape") {
        GC_ASSIGN_OR_RETURN(shape_, ParseShape());
      } else {
        return Error(absl::StrCat("unexpected key '", key,
                                  "' (expected descr, fortran_order, shape)"));
      }
      SkipSpace();
      if (Consume(',')) continue;
      GC_RETURN_IF_ERROR(Expect('}'));
      break;
    }
    SkipSpace();
    if (pos_ != text_.size()) return Error("trailing characters after '}'");
    if (!descr_ || !fortran_order_ || !shape_) {
      return Error("missing key: descr, fortran_order and shape are required");
    }
    return absl::OkStatus();
  }

  const std::string& descr() const { return *descr_; }
  bool fortran_order() const { return *fortran_order_; }
  const std::vector<int64_t>& shape() const { return *shape_; }

 private:
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("npy header at character ",
                                                   pos_, ": ", what, " in \"",
                                                   absl::CEscape(text_), "\""));
  }

  void SkipSpace() {
    while (pos_ < text_.size() && absl::ascii_isspace(text_[pos_])) ++pos_;
  }

  bool Consume(char c) {
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  absl::Status Expect(char c) {
    if (Consume(c)) return absl::OkStatus();
    return Error(absl::StrCat("expected '", std::string(1, c), "'"));
  }

  absl::StatusOr<std::string> ParseString() {
    if (pos_ >= text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"')) {
      return Error("expected a quoted string");
    }
    const char quote = text_[pos_++];
    const size_t end = text_.find(quote, pos_);
    if (end == absl::string_view::npos) return Error("unterminated string");
    std::string value(text_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return value;
  }

  absl::StatusOr<bool> ParseBool() {
    for (const auto& [word, value] :
         {std::pair<absl::string_view, bool>{"True", true}, {"False", false}}) {
      if (text_.substr(pos_, word.size()) == word) {
        pos_ += word.size();
        return value;
      }
    }
    return Error("expected True or False");
  }

  absl::StatusOr<std::vector<int64_t>> ParseShape() {
    GC_RETURN_IF_ERROR(Expect('('));
    std::vector<int64_t> shape;
    while (true) {
      SkipSpace();
      if (Consume(')')) break;
      const size_t start = pos_;
      while (pos_ < text_.size() && absl::ascii_isdigit(text_[pos_])) ++pos_;
      int64_t dim = 0;
      if (!absl::SimpleAtoi(text_.substr(start, pos_ - start), &dim)) {
        return Error("expected a non-negative integer dimension");
      }
      shape.push_back(dim);
      SkipSpace();
      if (Consume(',')) continue;
      GC_RETURN_IF_ERROR(Expect(')'));
      break;
    }
    return shape;
  }

  absl::string_view text_;
  size_t pos_ = 0;
  std::optional<std::string> descr_;
  std::optional<bool> fortran_order_;
  std::optional<std::vector<int64_t>> shape_;
};

absl::StatusOr<NpyDType> DTypeFromDescr(absl::string_view descr) {
  for (NpyDType dtype :
       {NpyDType::kFloat16, NpyDType::kFloat32, NpyDType::kFloat64}) {
    if (descr == NpyDescr(dtype)) return dtype;
  }
  if (!descr.empty() && descr[0] == '>') {
    return absl::InvalidArgumentError(absl::StrCat(
        "npy dtype '", descr,
        "' is big-endian; only little-endian <f2, <f4, <f8 are supported"));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "npy dtype '", descr, "' is not supported; expected <f2, <f4 or <f8"));
}

std::string ShapeTuple(const std::vector<int64_t>& shape) {
  if (shape.size() == 1) return absl::StrCat("(", shape[0], ",)");
  return absl::StrCat("(", absl::StrJoin(shape, ", "), ")");
}

}  // namespace

size_t NpyItemSize(NpyDType dtype) {
  switch (dtype) {
    case NpyDType::kFloat16:
      return 2;
    case NpyDType::kFloat32:
      return 4;
    case NpyDType::kFloat64:
      return 8;
  }
  return 0;
}

absl::string_view NpyDescr(NpyDType dtype) {
  switch (dtype) {
    case NpyDType::kFloat16:
      return "<f2";
    case NpyDType::kFloat32:
      return "<f4";
    case NpyDType::kFloat64:
      return "<f8";
  }
  return "";
}

absl::StatusOr<int64_t> NumElements(const std::vector<int64_t>& shape) {
  int64_t numel = 1;
  for (int64_t dim : shape) {
    if (dim < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shape [", absl::StrJoin(shape, ","), "] has a negative dimension"));
    }
    if (dim != 0 && numel > std::numeric_limits<int64_t>::max() / dim) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shape [", absl::StrJoin(shape, ","), "] has too many elements"));
    }
    numel *= dim;
  }
  return numel;
}

absl::StatusOr<NpyArray> ParseNpy(absl::string_view file) {
  if (file.size() < kV1PreambleBytes || file.substr(0, 6) != kMagic) {
    return absl::InvalidArgumentError(
        "not an npy file: it does not start with \\x93NUMPY");
  }
  const int major = static_cast<uint8_t>(file[6]);
  size_t preamble = 0;
  if (major == 1) {
    preamble = kV1PreambleBytes;
  } else if (major == 2 || major == 3) {
    preamble = kV2PreambleBytes;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("npy format version ", major, ".",
                     static_cast<int>(static_cast<uint8_t>(file[7])),
                     " is not supported; expected 1.0, 2.0 or 3.0"));
  }
  if (file.size() < preamble) {
    return absl::InvalidArgumentError("npy file truncated inside its preamble");
  }
  const uint32_t header_len = ReadLittleEndian(file.substr(8, preamble - 8));
  if (header_len > file.size() - preamble) {
    return absl::InvalidArgumentError(
        absl::StrCat("npy header length ", header_len, " exceeds the ",
                     file.size() - preamble, " bytes after the preamble"));
  }
  HeaderParser header(file.substr(preamble, header_len));
  GC_RETURN_IF_ERROR(header.Parse());
  if (header.fortran_order()) {
    return absl::InvalidArgumentError(
        "npy array is in Fortran order; only C order is supported "
        "(save np.ascontiguousarray(a))");
  }

  NpyArray array;
  GC_ASSIGN_OR_RETURN(array.dtype, DTypeFromDescr(header.descr()));
  array.shape = header.shape();
  GC_ASSIGN_OR_RETURN(const int64_t numel, NumElements(array.shape));
  const absl::string_view data = file.substr(preamble + header_len);
  const size_t itemsize = NpyItemSize(array.dtype);
  if (static_cast<uint64_t>(numel) > data.size() / itemsize ||
      static_cast<uint64_t>(numel) * itemsize != data.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "npy data is ", data.size(), " bytes; shape ", ShapeTuple(array.shape),
        " of ", header.descr(), " needs ", numel, " x ", itemsize, " bytes"));
  }
  array.data = std::string(data);
  return array;
}

absl::StatusOr<std::string> SerializeNpy(const NpyArray& array) {
  GC_ASSIGN_OR_RETURN(const int64_t numel, NumElements(array.shape));
  const size_t itemsize = NpyItemSize(array.dtype);
  if (static_cast<uint64_t>(numel) > array.data.size() / itemsize ||
      static_cast<uint64_t>(numel) * itemsize != array.data.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("array data is ", array.data.size(), " bytes; shape ",
                     ShapeTuple(array.shape), " needs ", numel * itemsize));
  }
  std::string dict = absl::StrCat(
      "{'descr': '", NpyDescr(array.dtype),
      "', 'fortran_order': False, 'shape': ", ShapeTuple(array.shape), ", }");
  // The header ends with '\n' and is space-padded so that the data starts
  // at a multiple of kHeaderAlignment.
  size_t preamble = kV1PreambleBytes;
  if (dict.size() + 1 + kV1PreambleBytes >
      std::numeric_limits<uint16_t>::max()) {
    preamble = kV2PreambleBytes;
  }
  const size_t unpadded = preamble + dict.size() + 1;
  const size_t padding =
      (kHeaderAlignment - unpadded % kHeaderAlignment) % kHeaderAlignment;
  dict.append(padding, ' ');
  dict.push_back('\n');

  std::string out(kMagic);
  out.push_back(static_cast<char>(preamble == kV1PreambleBytes ? 1 : 2));
  out.push_back(0);
  AppendLittleEndian(static_cast<uint32_t>(dict.size()), preamble - 8, out);
  out.append(dict);
  out.append(array.data);
  return out;
}

absl::StatusOr<NpyArray> ReadNpyFile(const std::string& path) {
  GC_ASSIGN_OR_RETURN(const std::string contents, ReadFileBytes(path));
  absl::StatusOr<NpyArray> array = ParseNpy(contents);
  if (!array.ok()) {
    return absl::Status(array.status().code(),
                        absl::StrCat(path, ": ", array.status().message()));
  }
  return array;
}

absl::Status WriteNpyFile(const std::string& path, const NpyArray& array) {
  GC_ASSIGN_OR_RETURN(const std::string bytes, SerializeNpy(array));
  return WriteFileBytes(path, bytes);
}

namespace {

absl::Status WriteInPlace(const std::string& path, absl::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create '", path, "': ", std::strerror(errno)));
  }
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) {
    return absl::DataLossError(absl::StrCat("error writing '", path, "'"));
  }
  return absl::OkStatus();
}

// An open file of its own beside the one it is to replace; closed when
// destroyed.
struct TemporaryFile {
  TemporaryFile(std::string p, int f) : path(std::move(p)), fd(f) {}
  TemporaryFile(TemporaryFile&& other) noexcept
      : path(std::move(other.path)), fd(std::exchange(other.fd, -1)) {}
  TemporaryFile& operator=(TemporaryFile&&) = delete;
  ~TemporaryFile() {
    if (fd >= 0) close(fd);
  }
  std::string path;
  int fd;
};

// `path`.tmp.<pid>.<n>, created exclusively: n counts the process's calls,
// so that threads (or a stale file of an earlier process with this pid)
// never share one.
absl::StatusOr<TemporaryFile> CreateTemporaryBeside(const std::string& path) {
  static std::atomic<uint64_t> next{0};
  for (;;) {
    std::string name = absl::StrCat(path, ".tmp.", getpid(), ".", next++);
    const int fd =
        open(name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0) return TemporaryFile(std::move(name), fd);
    if (errno != EEXIST) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot create '", name, "': ", std::strerror(errno)));
    }
  }
}

// Writes `bytes` and closes the file, which then holds them on disk: an
// error that only the flush or the close reports (a full disk, NFS, a
// quota) fails the call before anything replaces the old file.
absl::Status WriteAllAndClose(TemporaryFile& file, absl::string_view bytes) {
  const auto failed = [&file](absl::string_view what) {
    return absl::DataLossError(
        absl::StrCat(what, " '", file.path, "': ", std::strerror(errno)));
  };
  while (!bytes.empty()) {
    const ssize_t n = write(file.fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return failed("error writing");
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  if (fsync(file.fd) != 0) return failed("error flushing");
  if (close(std::exchange(file.fd, -1)) != 0) return failed("error closing");
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteFileBytes(const std::string& link_or_path,
                            absl::string_view bytes) {
  // A link (a "latest" checkpoint naming the newest) is written through:
  // the file it names is replaced and the link stays (renaming over the link
  // replaced the link and left that file as it was). A dangling link is
  // written in place, which makes the file it names.
  std::string path = link_or_path;
  struct stat link {};
  if (lstat(path.c_str(), &link) == 0 && S_ISLNK(link.st_mode)) {
    char resolved[PATH_MAX];
    if (realpath(path.c_str(), resolved) == nullptr) {
      return WriteInPlace(path, bytes);
    }
    path = resolved;
  }
  // A regular file (an earlier checkpoint, say) is replaced only once the
  // new bytes are all written: a full disk or a kill leaves it as it was.
  // Anything else (/dev/stdout, a FIFO) is written in place.
  struct stat st {};
  const bool exists = stat(path.c_str(), &st) == 0;
  if (exists && !S_ISREG(st.st_mode)) return WriteInPlace(path, bytes);
  GC_ASSIGN_OR_RETURN(TemporaryFile temporary, CreateTemporaryBeside(path));
  absl::Cleanup removed = [&temporary] { std::remove(temporary.path.c_str()); };
  // The file keeps its permission bits (a 0600 checkpoint stays private);
  // a new one gets 0666 less the umask, as any other.
  if (exists && fchmod(temporary.fd, st.st_mode & 07777) != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot set the mode of '", temporary.path,
                     "': ", std::strerror(errno)));
  }
  GC_RETURN_IF_ERROR(WriteAllAndClose(temporary, bytes));
  if (std::rename(temporary.path.c_str(), path.c_str()) != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot replace '", path, "': ", std::strerror(errno)));
  }
  std::move(removed).Cancel();
  return absl::OkStatus();
}

}  // namespace gradcomp::client
