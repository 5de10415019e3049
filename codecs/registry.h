// Codecs by name: a factory per codec, so the daemon, the clients and the
// tests create any codec from a name and parameters.
//
//   const CodecRegistry& registry = BuiltinCodecs();  // codecs/builtin.h
//   GC_ASSIGN_OR_RETURN(std::unique_ptr<Codec> codec,
//                       registry.Create("topk", CodecParams({{"ratio",
//                       "0.01"}})));
#ifndef GRADCOMP_CODECS_REGISTRY_H_
#define GRADCOMP_CODECS_REGISTRY_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "codecs/codec.h"
#include "codecs/params.h"

namespace gradcomp::codecs {

using CodecFactory = std::function<absl::StatusOr<std::unique_ptr<Codec>>(
    const CodecParams& params)>;

class CodecRegistry {
 public:
  // AlreadyExists if the name is taken.
  absl::Status Register(CodecInfo info, CodecFactory factory);

  // NotFound naming the known codecs if `name` is unknown; the factory's
  // InvalidArgument if a parameter is bad or unknown.
  absl::StatusOr<std::unique_ptr<Codec>> Create(
      absl::string_view name, const CodecParams& params) const;

  // Every registered codec, by name.
  std::vector<CodecInfo> List() const;

 private:
  struct Registration {
    CodecInfo info;
    CodecFactory factory;
  };
  std::map<std::string, Registration, std::less<>> codecs_;
};

}  // namespace gradcomp::codecs

#endif  // GRADCOMP_CODECS_REGISTRY_H_
